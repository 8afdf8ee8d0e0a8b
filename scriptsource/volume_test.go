package scriptsource

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A folder is a ConfigMap's volume when the kubelet's atomic writer made it from
// that ConfigMap's keys alone; anything else is named.
func TestNotAVolumeOf(t *testing.T) {
	keys := []string{"a.lua", "lib__b.lua", "notes.txt"}
	for _, tc := range []struct {
		name  string
		build func(t *testing.T, dir string)
		keys  []string
		want  string // "" or a part of the reason
	}{
		{name: "the ConfigMap's volume", build: volume("a.lua", "lib__b.lua", "notes.txt"), keys: keys},
		{name: "fewer entries than keys (a key just added)", build: volume("a.lua"), keys: keys},
		{name: "a plain folder", build: func(t *testing.T, dir string) { write(t, filepath.Join(dir, "a.lua")) }, keys: keys, want: "no ..data link"},
		{name: "a projected volume", build: volume("a.lua", "token"), keys: keys, want: "token is not a key"},
		{name: "a file added", build: func(t *testing.T, dir string) {
			volume("a.lua")(t, dir)
			write(t, filepath.Join(dir, "extra.lua"))
		}, keys: keys, want: "extra.lua is not a link into ..data"},
		{name: "a folder inside", build: func(t *testing.T, dir string) {
			volume("a.lua")(t, dir)
			if err := os.Mkdir(filepath.Join(dir, "lib"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, keys: keys, want: "lib is a folder"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.build(t, dir)
			got := NotAVolumeOf(dir, tc.keys)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("NotAVolumeOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// volume lays keys out as the kubelet does: ..data -> ..gen, KEY -> ..data/KEY.
func volume(keys ...string) func(t *testing.T, dir string) {
	return func(t *testing.T, dir string) {
		for _, k := range keys {
			write(t, filepath.Join(dir, "..gen", k))
			if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("..gen", filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
}

func write(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("return 1"), 0o644); err != nil {
		t.Fatal(err)
	}
}
