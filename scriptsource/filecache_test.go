package scriptsource

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// FileCache: a watcher's read opens only the files that changed, and never serves an
// old content: a same-size rewrite right after a read, a rename over a file, a
// deletion, a new file and a ConfigMap-style symlink swap are all seen.
func TestFileCacheReadsOnlyChangedFilesAndMissesNoChange(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the cache needs Linux's stat fields; elsewhere every file is read")
	}
	dir := t.TempDir()
	if !onLocalFileSystem(dir) {
		t.Skip("the temporary folder is not on a local file system; every file is read there")
	}
	write := func(name, src string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"a.lua", "b.lua", "c.lua", "lib/d.lua"} {
		write(n, "-- "+n)
	}
	c := &FileCache{}
	read := func(what string, want map[string]string, opened int) {
		t.Helper()
		c.opened = 0
		tree, err := c.ReadTree(dir)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got := map[string]string{}
		for _, s := range tree.Scripts {
			got[s.Name] = string(s.Source)
		}
		for name, src := range want {
			if got[name] != src {
				t.Errorf("%s: %s = %q, want %q", what, name, got[name], src)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: read %d scripts %v, want %d", what, len(got), got, len(want))
		}
		if opened >= 0 && c.opened != opened {
			t.Errorf("%s: opened %d files, want %d", what, c.opened, opened)
		}
	}
	want := map[string]string{"a.lua": "-- a.lua", "b.lua": "-- b.lua", "c.lua": "-- c.lua", "lib/d.lua": "-- lib/d.lua"}

	// Files changed just now are read every time: within a tick of the kernel's
	// coarse clock a same-size rewrite keeps every stat field.
	read("first read", want, 4)
	write("a.lua", "-- A.lua") // same size, same tick (most likely)
	want["a.lua"] = "-- A.lua"
	read("same-size rewrite right after a read", want, 4)

	// Later (the clock moved past racilyClean), unchanged files come from the cache.
	c.now = func() time.Time { return time.Now().Add(2 * racilyClean) }
	read("every file settled", want, 4)
	read("nothing changed", want, 0)
	write("b.lua", "-- b.lua, longer")
	want["b.lua"] = "-- b.lua, longer"
	read("one file rewritten", want, 1)

	// A same-size rewrite that puts the old modification time back (cp -p, rsync -t,
	// touch -r): the change time still moves.
	fi, err := os.Stat(filepath.Join(dir, "a.lua"))
	if err != nil {
		t.Fatal(err)
	}
	write("a.lua", "-- a.LUA")
	if err := os.Chtimes(filepath.Join(dir, "a.lua"), fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	want["a.lua"] = "-- a.LUA"
	read("same size, modification time restored", want, 1)

	// A rename over a file (how editors and kubectl save) is a new inode.
	tmp := filepath.Join(dir, ".c.lua.tmp")
	if err := os.WriteFile(tmp, []byte("-- C.lua"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "c.lua")); err != nil {
		t.Fatal(err)
	}
	want["c.lua"] = "-- C.lua"
	read("renamed over", want, 1)

	if err := os.Remove(filepath.Join(dir, "lib/d.lua")); err != nil {
		t.Fatal(err)
	}
	delete(want, "lib/d.lua")
	write("e.lua", "-- e")
	want["e.lua"] = "-- e"
	read("one deleted, one new", want, 1)
}

// A ConfigMap volume: keys are links to ..data/<key>, and an update swaps ..data to a
// new folder; the links' targets change while the links themselves do not.
func TestFileCacheFollowsAConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	mk := func(gen, src string) {
		t.Helper()
		d := filepath.Join(dir, gen)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "main.lua"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mk("..2026_1", "-- one")
	if err := os.Symlink("..2026_1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/main.lua", filepath.Join(dir, "main.lua")); err != nil {
		t.Fatal(err)
	}
	c := &FileCache{now: func() time.Time { return time.Now().Add(2 * racilyClean) }}
	for _, step := range []struct{ gen, src string }{{"", "-- one"}, {"..2026_2", "-- two"}, {"..2026_3", "-- six"}} {
		if step.gen != "" {
			mk(step.gen, step.src) // same size as before
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(step.gen, tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
		}
		tree, err := c.ReadTree(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(tree.Scripts) != 1 || string(tree.Scripts[0].Source) != step.src {
			t.Errorf("after swapping to %q: scripts %v, want main.lua = %q", step.gen, tree.Scripts, step.src)
		}
	}
}
