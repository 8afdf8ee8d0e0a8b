package scriptsource

import "testing"

// ConfigMap keys cannot hold "/": a top-level lib__util.lua stands for lib/util.lua.
func TestFlatKeyPath(t *testing.T) {
	for name, want := range map[string]string{
		"widgets.lua":           "widgets.lua",
		"lib__util.lua":         "lib/util.lua",
		"lib__net__http.lua":    "lib/net/http.lua",
		"lib__init.lua":         "lib/init.lua",
		"my_helpers__str.lua":   "my_helpers/str.lua",
		"__init.lua":            "__init.lua",
		"a____b.lua":            "a____b.lua",
		"lib__.lua":             "lib__.lua",
		"notes__todo.txt":       "notes__todo.txt",
		"single_underscore.lua": "single_underscore.lua",
	} {
		if got := FlatKeyPath(name); got != want {
			t.Errorf("FlatKeyPath(%q) = %q, want %q", name, got, want)
		}
	}
}
