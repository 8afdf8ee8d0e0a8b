package scriptsource

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
)

// Script is one Lua file of the scripts folder.
type Script struct {
	// Name is the path relative to the scripts folder, with forward slashes
	// ("widgets.lua", "lib/util.lua"). It names the file in every error message.
	Name   string
	Source []byte
}

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
func ReadTree(dir string) (Tree, error) { return (*FileCache)(nil).ReadTree(dir) }

// FileCache keeps the scripts its ReadTree read, with what stat said of each file,
// so that the next ReadTree opens only the files that changed: with 500 scripts,
// reading them all again was about a fifth of a reload's CPU. A file is taken from the
// cache only when its identity (device, inode, size, modification and change times)
// is the same and it was last changed well before it was read (racilyClean): file
// times tick with the kernel's coarse clock, so a file rewritten with the same size
// within one tick of being read would otherwise look unchanged. Where stat gives no
// identity (not Linux), or the folder is not on a local file system (ext4, xfs,
// btrfs, tmpfs, overlay, zfs: network and FUSE file systems may answer stat from a
// cache), every file is read. The zero value is ready; a nil cache reads every file. Not safe for concurrent use: it has one owner (a watcher).
type FileCache struct {
	files map[string]cachedFile // by path as walked
	// now is the clock (time.Now when nil); opened counts the files read (tests).
	now    func() time.Time
	opened int
}

type cachedFile struct {
	id  fileIdentity
	src []byte
}

// racilyClean is how long before a read a file must have last changed for the
// cached content to be trusted later (a few ticks of the kernel's coarse clock).
const racilyClean = time.Second

// read returns the content of the script at p, from the cache when it is unchanged,
// and records it in next.
func (c *FileCache) read(p string, next map[string]cachedFile) ([]byte, error) {
	if c == nil {
		return os.ReadFile(p) // follows links
	}
	before := time.Now()
	if c.now != nil {
		before = c.now()
	}
	fi, err := os.Stat(p) // follows links
	if err != nil {
		return nil, err
	}
	id, ok := identityOf(fi)
	if ok {
		if f, hit := c.files[p]; hit && f.id == id {
			next[p] = f
			return f.src, nil
		}
	}
	src, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	c.opened++
	if ok && id.changed < before.Add(-racilyClean).UnixNano() {
		if fi2, err := os.Stat(p); err == nil { // unchanged while it was read
			if id2, ok2 := identityOf(fi2); ok2 && id2 == id {
				next[p] = cachedFile{id: id, src: src}
			}
		}
	}
	return src, nil
}

// ReadTree is [ReadTree] reading again only the files that changed since the last
// call; the cache then holds what this call read.
func (c *FileCache) ReadTree(dir string) (Tree, error) {
	var (
		t    Tree
		next map[string]cachedFile
	)
	if c != nil && !onLocalFileSystem(dir) {
		c.files = nil
		c = nil // every file is read
	}
	if c != nil {
		next = make(map[string]cachedFile, len(c.files))
	}
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
		src, err := c.read(p, next)
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
	if c != nil {
		c.files = next
	}
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

// ScriptsOfConfigMap maps a ConfigMap's data to scripts as a mounted ConfigMap is
// read (ReadDir): the *.lua keys, "lib__util.lua" read as "lib/util.lua".
func ScriptsOfConfigMap(data map[string]string) ([]Script, error) {
	seen := map[string]string{}
	var scripts []Script
	for key, src := range data {
		if IgnoredName(key) || !strings.HasSuffix(key, ".lua") {
			continue
		}
		name := FlatKeyPath(key)
		if first, dup := seen[name]; dup {
			a, b := first, key
			if b < a {
				a, b = b, a
			}
			return nil, fmt.Errorf("keys %s and %s both stand for %s (a key a__b.lua is read as a/b.lua): keep one", a, b, name)
		}
		seen[name] = key
		scripts = append(scripts, Script{Name: name, Source: []byte(src)})
	}
	sort.Slice(scripts, func(i, j int) bool { return scripts[i].Name < scripts[j].Name })
	return scripts, nil
}

// ConfigMapKey is the ConfigMap key of a script: its folders joined by "__"
// (FlatKeyPath reads it back).
func ConfigMapKey(name string) string { return strings.ReplaceAll(name, "/", "__") }
