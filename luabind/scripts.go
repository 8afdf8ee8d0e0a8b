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
	var scripts []Script
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if IgnoredName(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".lua") {
			return nil
		}
		src, err := os.ReadFile(p) // follows links
		if err != nil {
			return fmt.Errorf("reading script %s: %w", rel, err)
		}
		scripts = append(scripts, Script{Name: filepath.ToSlash(rel), Source: src})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(scripts, func(i, j int) bool { return scripts[i].Name < scripts[j].Name })
	return scripts, nil
}

// IgnoredName tells whether a file or folder name is not part of the scripts: hidden
// entries, swap and backup files of editors, JetBrains safe-write temporaries.
func IgnoredName(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasSuffix(name, "~") || strings.HasSuffix(name, ".swp") ||
		strings.HasSuffix(name, ".swx") || name == "4913" || strings.Contains(name, "___jb_")
}
