package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/luaop/luaop/testcluster"
)

// Every command's --help has Examples, and those that need no cluster run as
// written (in a folder whose scripts/ holds the examples) and succeed.
func TestHelpExamplesRun(t *testing.T) {
	var missing []string
	var offline []string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.TrimPrefix(c.CommandPath(), "luaop ")
		if c.HasParent() && c.Runnable() && path != "help" && !strings.HasPrefix(path, "completion") {
			if c.Example == "" {
				missing = append(missing, path)
			}
			switch c.Name() {
			case "check", "test", "rbac", "init", "stubs", "version":
				for _, line := range strings.Split(c.Example, "\n") {
					offline = append(offline, strings.TrimSpace(line))
				}
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCommand())
	if len(missing) > 0 {
		t.Errorf("commands without Examples in their --help: %v (add them to commandExamples)", missing)
	}
	bin := buildLuaopBinary(t)
	work := t.TempDir()
	if err := os.CopyFS(filepath.Join(work, "scripts"), os.DirFS(filepath.Join(testcluster.RepoRoot(), "scripts", "examples"))); err != nil {
		t.Fatal(err)
	}
	for _, example := range offline {
		cmd := exec.CommandContext(t.Context(), "bash", "-euo", "pipefail", "-c", example)
		cmd.Dir = work
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("the example %q: %v\n%s", example, err, out)
		}
	}
}
