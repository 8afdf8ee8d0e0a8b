package luabind

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// ReadDir reads the Lua scripts of a folder: every *.lua file below it, following
// symbolic links to files (a ConfigMap volume's keys are links into its ..data folder).
// Hidden entries (".git", "..data", ".#file") and editor leftovers are skipped.
//
// A ConfigMap is one flat folder (its keys cannot hold "/"), so a top-level file whose
// name holds "__" stands for a file of a sub-folder: "lib__util.lua" is read as
// "lib/util.lua" (a module, require("lib.util")), "lib__net__http.lua" as
// "lib/net/http.lua". Names with an empty part ("__init.lua", "a____b.lua") are kept
// as they are. A file and its flat spelling both present are an error.
func ReadDir(dir string) ([]Script, error) {
	t, err := ReadTree(dir)
	return t.Scripts, err
}

// Tree is what [ReadTree] read.
type Tree struct {
	// Scripts are the scripts, sorted by name, as ReadDir returns them.
	Scripts []Script
	// Dirs are the folders read: dir itself, then every folder below it that is
	// not skipped, in walk order.
	Dirs []string
	// Links are the paths of the scripts that are symbolic links.
	Links []string
}

// ReadTree is ReadDir that also tells which folders it read and which scripts are
// symbolic links, in the same single walk (a watcher needs both after every read).
func ReadTree(dir string) (Tree, error) {
	var t Tree
	seen := map[string]string{} // script name -> the file read as it
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			if d.IsDir() {
				t.Dirs = append(t.Dirs, p)
			}
			return nil
		}
		if IgnoredName(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			t.Dirs = append(t.Dirs, p)
			return nil
		}
		if !strings.HasSuffix(d.Name(), ".lua") {
			return nil
		}
		src, err := os.ReadFile(p) // follows links
		if err != nil {
			return fmt.Errorf("reading script %s: %w", rel, err)
		}
		if d.Type()&fs.ModeSymlink != 0 {
			t.Links = append(t.Links, p)
		}
		name := filepath.ToSlash(rel)
		if !strings.Contains(name, "/") {
			name = FlatKeyPath(name)
		}
		if first, dup := seen[name]; dup {
			return fmt.Errorf("scripts %s and %s both stand for %s (a top-level a__b.lua is read as a/b.lua, for ConfigMaps): keep one", first, rel, name)
		}
		seen[name] = rel
		t.Scripts = append(t.Scripts, Script{Name: name, Source: src})
		return nil
	})
	if err != nil {
		return Tree{}, err
	}
	sort.Slice(t.Scripts, func(i, j int) bool { return t.Scripts[i].Name < t.Scripts[j].Name })
	return t, nil
}

// FlatKeyPath is the path a top-level file name stands for: "lib__util.lua" ->
// "lib/util.lua" (ConfigMap keys cannot hold "/"); other names are returned as they are.
func FlatKeyPath(name string) string {
	stem, ok := strings.CutSuffix(name, ".lua")
	if !ok || !strings.Contains(stem, "__") {
		return name
	}
	parts := strings.Split(stem, "__")
	if slices.Contains(parts, "") {
		return name
	}
	return strings.Join(parts, "/") + ".lua"
}

// IgnoredName tells whether a file or folder name is not part of the scripts: hidden
// entries, swap and backup files of editors, JetBrains safe-write temporaries.
func IgnoredName(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasSuffix(name, "~") || strings.HasSuffix(name, ".swp") ||
		strings.HasSuffix(name, ".swx") || name == "4913" || strings.Contains(name, "___jb_")
}
