package kindlike

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/testcluster"
)

// cluster is the kind-like control plane of the package.
type cluster struct {
	*testcluster.Env
	// Kubeconfig is its admin kubeconfig (server https://127.0.0.1:<published port>).
	Kubeconfig string
	// State is its state folder; Netns, Veth, HostIP and NodeIP come from its
	// netns.env (see localcluster/up.sh).
	State, Netns, Veth, HostIP, NodeIP string
	// Luaop is the luaop command built from the working tree.
	Luaop string
}

var (
	kind *cluster
	// skipReason is why the tests skip ("" when the cluster is up).
	skipReason string
)

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kindlike:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if os.Getenv("LUAOP_TEST_NO_CLUSTER") == "1" {
		skipReason = "LUAOP_TEST_NO_CLUSTER=1: these tests need a cluster"
		return m.Run(), nil
	}
	root := testcluster.RepoRoot()
	state := stateFolder()
	script := func(name string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(root, "localcluster", name))
		cmd.Env = append(os.Environ(), "LUAOP_CLUSTER_DIR="+state, "LUAOP_CLUSTER_TOPOLOGY=netns", "LUAOP_NO_BUILD=1")
		return cmd
	}
	up := script("up.sh")
	var stderr bytes.Buffer
	up.Stderr = &stderr
	out, err := up.Output()
	defer func() {
		if out, err := script("down.sh").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "kindlike: stopping the cluster: %v\n%s", err, out)
		}
	}()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		// up.sh could not make a network namespace: not root, or no iproute2.
		reason := "the kind-like topology cannot be made here: " + strings.TrimSpace(stderr.String())
		if os.Getenv("CI") == "true" {
			return 0, errors.New(reason + " (CI runs these tests as root)")
		}
		skipReason = reason
		return m.Run(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("starting the kind-like cluster: %v\n%s", err, stderr.String())
	}
	c := &cluster{Kubeconfig: strings.TrimSpace(string(out)), State: state}
	if err := c.readNetns(); err != nil {
		return 0, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return 0, err
	}
	c.Env = &testcluster.Env{Config: cfg}
	if c.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return 0, err
	}
	if c.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return 0, err
	}
	// Every test can run alone: the example CRDs are there (the first test applies
	// them again, through luaop dev --apply).
	if err := c.InstallCRDs(context.Background(), filepath.Join(root, "scripts", "examples", "crds")); err != nil {
		return 0, fmt.Errorf("installing the example CRDs: %w", err)
	}
	bin := filepath.Join(state, "luaop-under-test")
	build := exec.Command("go", "build", "-o", bin, "./cmd/luaop")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("building luaop: %v\n%s", err, out)
	}
	c.Luaop = bin
	kind = c
	return m.Run(), nil
}

// stateFolder is the cluster's state folder: next to the test cluster's
// (LUAOP_TEST_CLUSTER_DIR), so that two checkouts testing at once do not share one;
// the network namespace's names derive from it.
func stateFolder() string {
	if dir := os.Getenv("LUAOP_TEST_CLUSTER_DIR"); dir != "" {
		return dir + "-kindlike"
	}
	cache := os.Getenv("LUAOP_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cache = filepath.Join(base, "luaop")
	}
	return filepath.Join(cache, "cluster-test-kindlike")
}

func (c *cluster) readNetns() error {
	f, err := os.Open(filepath.Join(c.State, "netns.env"))
	if err != nil {
		return fmt.Errorf("the kind-like cluster has no netns.env: %w", err)
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "NETNS":
			c.Netns = v
		case "VETH":
			c.Veth = v
		case "HOST_IP":
			c.HostIP = v
		case "NODE_IP":
			c.NodeIP = v
		}
	}
	if c.Netns == "" || c.Veth == "" || c.HostIP == "" || c.NodeIP == "" {
		return errors.New("netns.env lacks NETNS, VETH, HOST_IP or NODE_IP")
	}
	return sc.Err()
}

// require skips t when the kind-like cluster is not up, saying why.
func require(t *testing.T) *cluster {
	t.Helper()
	if kind == nil {
		t.Skip(skipReason)
	}
	return kind
}
