package luabind

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ReadDir reads the Lua scripts of a folder: every *.lua file below it, following
// symbolic links to files (a ConfigMap volume's keys are links into its ..data folder).
// Hidden entries (".git", "..data", ".#file") and editor leftovers are skipped.
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
		t.Scripts = append(t.Scripts, Script{Name: filepath.ToSlash(rel), Source: src})
		return nil
	})
	if err != nil {
		return Tree{}, err
	}
	sort.Slice(t.Scripts, func(i, j int) bool { return t.Scripts[i].Name < t.Scripts[j].Name })
	return t, nil
}

// IgnoredName tells whether a file or folder name is not part of the scripts: hidden
// entries, swap and backup files of editors, JetBrains safe-write temporaries.
func IgnoredName(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasSuffix(name, "~") || strings.HasSuffix(name, ".swp") ||
		strings.HasSuffix(name, ".swx") || name == "4913" || strings.Contains(name, "___jb_")
}
