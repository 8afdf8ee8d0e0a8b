package testcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

var volumeGeneration atomic.Int64

// WriteConfigMapVolume writes data into dir as the kubelet's atomic writer writes a
// ConfigMap volume, the first time and at every update: the content in a new
// hidden folder "..<generation>", a link "..data_tmp" to it renamed over "..data"
// (the one atomic step), the previous content folder removed, a link "KEY" to
// "..data/KEY" for each key, and the links of keys no longer in data removed.
func WriteConfigMapVolume(dir string, data map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	gen := fmt.Sprintf("..%d_%d", os.Getpid(), volumeGeneration.Add(1))
	for k, v := range data {
		if err := os.MkdirAll(filepath.Join(dir, gen), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, gen, k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	if len(data) == 0 {
		if err := os.MkdirAll(filepath.Join(dir, gen), 0o755); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if _, keep := data[e.Name()]; !keep && !strings.HasPrefix(e.Name(), ".") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	for k := range data {
		link := filepath.Join(dir, k)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
			return err
		}
	}
	return nil
}
