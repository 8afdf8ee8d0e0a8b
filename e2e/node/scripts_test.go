package node

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNodeDownOfAHalfStartedNode runs localcluster/node-down.sh on the state a
// node-up.sh leaves when it fails before the node's cgroups exist (its description
// written, nothing else), with a standard input that stays open, as a terminal's
// does for `make node-down`: it must finish, read nothing of that input (it would
// take what it reads for PIDs to kill) and remove the node's folder. It needs no
// node: the names it is given exist nowhere.
func TestNodeDownOfAHalfStartedNode(t *testing.T) {
	if _, err := exec.LookPath("findmnt"); err != nil {
		t.Skip("no findmnt (util-linux): localcluster/node-deps.sh installs it")
	}
	repo := filepath.Join("..", "..")
	state := t.TempDir()
	node := filepath.Join(state, "node")
	if err := os.MkdirAll(node, 0o755); err != nil {
		t.Fatal(err)
	}
	// Octet 0 of 198.19: node-up.sh never picks it (1-254), so no route matches.
	suffix := fmt.Sprintf("%08x", time.Now().UnixNano()&0xffffffff)
	env := strings.Join([]string{
		"NODE_NAME=luaop-node",
		"NODE_NETNS=luaop-node-t" + suffix,
		"NODE_VETH=lndt" + suffix[:6],
		"NODE_POD_CIDR=198.19.0.128/25",
		"NODE_SERVICE_CIDR=198.19.0.64/26",
		"NODE_CGROUP_ROOT=/luaop-node-t" + suffix,
		"NODE_CONTAINERD_SOCKET=" + filepath.Join(node, "containerd.sock"),
	}, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(node, "node.env"), []byte(env), 0o644); err != nil {
		t.Fatal(err)
	}
	stdin, typing, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	defer typing.Close() // open until the script is done: it never sees the end of its input
	if _, err := typing.WriteString("99999999\n"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repo, "localcluster", "node-down.sh"))
	cmd.Env = append(os.Environ(), "LUAOP_CLUSTER_DIR="+state, "LUAOP_CACHE="+filepath.Join(state, "cache"))
	cmd.Stdin = stdin
	cmd.WaitDelay = 5 * time.Second // its children may hold the output open
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("node-down.sh did not finish in a minute (waiting for its standard input?):\n%s", out)
	}
	if err != nil || strings.Contains(string(out), "left behind") || strings.Contains(string(out), "99999999") {
		t.Errorf("node-down.sh: %v\n%s", err, out)
	}
	if _, err := os.Stat(node); !os.IsNotExist(err) {
		t.Errorf("the node's folder is still there (%v)", err)
	}
}
