package scriptsource

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// NotAVolumeOf tells why the folder dir is not a volume of one ConfigMap whose keys
// are keys (all of them: data and binaryData), as the kubelet mounts it: "" when
// it is. The kubelet's atomic writer makes such a folder: a link "..data" to a
// hidden folder of the content, and for each key a link "KEY" to "..data/KEY";
// nothing else that is not hidden. A plain folder of files (no "..data"), a folder
// inside it (a volume with items and paths), or an entry that is not one of the
// keys (a projected volume of several sources, or files added to the folder) each
// make it something else, and the reason names the first such entry.
//
// A key removed from the ConfigMap since the kubelet last wrote the folder is still
// in it: that reads as an entry that is not a key.
func NotAVolumeOf(dir string, keys []string) string {
	if fi, err := os.Lstat(filepath.Join(dir, "..data")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return "it has no ..data link: not a ConfigMap volume as the kubelet mounts it"
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "it cannot be read: " + err.Error()
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if e.IsDir() {
			return fmt.Sprintf("%s is a folder (a ConfigMap volume has none)", name)
		}
		if target, err := os.Readlink(filepath.Join(dir, name)); err != nil || target != filepath.Join("..data", name) {
			return fmt.Sprintf("%s is not a link into ..data (a file added to the folder?)", name)
		}
		if !slices.Contains(keys, name) {
			return fmt.Sprintf("%s is not a key of the ConfigMap (a projected volume of several sources?)", name)
		}
	}
	return ""
}
