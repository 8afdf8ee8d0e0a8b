package node

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/testcluster"
)

// TestLocalNodeRecipe runs deploy/README's "On the local node" recipe as the README
// writes it, block and all: `make node`, `make image-archive` and the load into the
// node, `kubectl apply -k deploy/examples`, the rollout, the example objects and
// their handling, the logs, `make node-down`. It runs in a copy of the repository's
// tracked files (a fresh clone: no bin/), with kubectl of the control plane's
// version on PATH, the node in a state folder of its own (NODE_CLUSTER_DIR and
// LUAOP_CLUSTER_DIR: the environment, not the recipe, moves it), so a recipe that
// drifts from what works fails here. Each command's time is in the log (set -x).
func TestLocalNodeRecipe(t *testing.T) {
	c := need(t)
	block := recipeBlock(t, filepath.Join(c.repo, "deploy", "README.md"), "**On the local node**")
	clone := t.TempDir()
	if err := testcluster.CleanCopy(c.repo, clone); err != nil {
		t.Fatal(err)
	}
	state := os.Getenv("LUAOP_TEST_NODE_DIR")
	if state == "" {
		state = filepath.Dir(c.kubeconfig)
	}
	state += "-recipe"
	down := func() {
		cmd := exec.Command(filepath.Join(c.repo, "localcluster", "node-down.sh"))
		cmd.Env = append(os.Environ(), "LUAOP_CLUSTER_DIR="+state)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("node-down.sh of the recipe's node: %v\n%s", err, out)
		}
	}
	down() // anything an earlier run left
	t.Cleanup(down)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	script := "set -euo pipefail\nexport PS4='+ [$(date +%T.%3N)] '\nset -x\n" + block
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = clone
	// A user's shell: no KUBECONFIG of the suite's, and none of make's variables
	// (under `make test`, MAKELEVEL and MAKEFLAGS make the recipe's own make print
	// "Entering directory" into `$(make node)`).
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "KUBECONFIG", "PATH", "MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES":
			continue
		}
		env = append(env, kv)
	}
	cmd.Env = append(env, "NODE_CLUSTER_DIR="+state, "LUAOP_CLUSTER_DIR="+state,
		"PATH="+filepath.Dir(c.kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.WaitDelay = 10 * time.Second
	log := &testcluster.LogBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	began := time.Now()
	err := cmd.Run()
	t.Logf("deploy/README's local node recipe, as written (%s):\n%s", time.Since(began).Round(time.Second), commandLines(log.String()))
	if err != nil {
		t.Fatalf("the recipe failed: %v\n%s", err, log.String())
	}
	if _, err := os.Stat(filepath.Join(state, "node")); !os.IsNotExist(err) {
		t.Errorf("the node's folder is still there after the recipe's make node-down (%v)", err)
	}
}

// recipeBlock is the first fenced block after the line of the markdown file that
// starts with heading.
func recipeBlock(t *testing.T, file, heading string) string {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(text), "\n"+heading)
	if !ok {
		t.Fatalf("%s has no %q", file, heading)
	}
	_, after, ok = strings.Cut(after, "\n```sh\n")
	if !ok {
		t.Fatalf("%s has no ```sh block after %q", file, heading)
	}
	block, _, ok := strings.Cut(after, "\n```")
	if !ok {
		t.Fatalf("%s: the block after %q does not end", file, heading)
	}
	return block + "\n"
}

// commandLines are the lines of set -x: each command with its start time.
func commandLines(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "+ [") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
