package scriptsource

import (
	"strings"
	"testing"
)

func TestScriptsOfConfigMap(t *testing.T) {
	for _, tt := range []struct {
		name    string
		data    map[string]string
		want    []string
		wantErr string
	}{
		{"flat keys stand for folders", map[string]string{"hello.lua": "", "lib__greeting.lua": "", "README.md": "", ".hidden.lua": ""},
			[]string{"hello.lua", "lib/greeting.lua"}, ""},
		{"empty part kept", map[string]string{"__init.lua": ""}, []string{"__init.lua"}, ""},
		{"two keys for one file", map[string]string{"lib__a.lua": "", "lib/a.lua": ""}, nil, "both stand for lib/a.lua"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			scripts, err := ScriptsOfConfigMap(tt.data)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one with %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, s := range scripts {
				names = append(names, s.Name)
			}
			if strings.Join(names, ",") != strings.Join(tt.want, ",") {
				t.Errorf("scripts %v, want %v", names, tt.want)
			}
		})
	}
}
