package testcluster

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// CleanCopy copies the files git tracks in the repository repo, as the working tree
// has them, into dst: what a fresh clone of the working tree holds, and nothing a
// build or a test made (bin/, dist/, untracked files). Modes (executable scripts)
// and symbolic links are kept. The copy has no .git.
func CleanCopy(repo, dst string) error {
	out, err := exec.Command("git", "-C", repo, "ls-files", "-z").Output()
	if err != nil {
		return fmt.Errorf("git ls-files in %s: %w", repo, err)
	}
	for _, rel := range bytes.Split(bytes.TrimSuffix(out, []byte{0}), []byte{0}) {
		if err := copyEntry(filepath.Join(repo, string(rel)), filepath.Join(dst, string(rel))); err != nil {
			return err
		}
	}
	return nil
}

func copyEntry(src, dst string) error {
	fi, err := os.Lstat(src)
	if os.IsNotExist(err) {
		return nil // deleted in the working tree, not yet in the index
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(target, dst)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
