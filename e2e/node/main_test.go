package node

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/testcluster"
)

// cluster is the node's cluster; nil when the suite skips (skipReason says why).
var (
	cluster    *nodeCluster
	skipReason string
)

// nodeCluster is a connection to the cluster of localcluster/node-up.sh.
type nodeCluster struct {
	kubeconfig string
	cfg        *rest.Config
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	env        map[string]string // node/node.env: the node's names and addresses
	kubectl    string            // kubectl of the control plane's version
	repo       string
}

func TestMain(m *testing.M) {
	switch {
	case os.Getenv("LUAOP_TEST_NO_CLUSTER") == "1":
		skipReason = "LUAOP_TEST_NO_CLUSTER=1: the node suite needs a node"
	case os.Getenv("LUAOP_TEST_NODE_SKIP") != "":
		skipReason = "no node on this machine: " + os.Getenv("LUAOP_TEST_NODE_SKIP")
	case os.Getenv("LUAOP_TEST_NODE_KUBECONFIG") == "":
		skipReason = "no node: LUAOP_TEST_NODE_KUBECONFIG is not set; run `make test` " +
			"(localcluster/with-node.sh starts one) or `localcluster/with-node.sh go test -v ./e2e/node`"
	default:
		c, err := connect()
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e/node:", err)
			os.Exit(1)
		}
		cluster = c
	}
	if cluster == nil {
		fmt.Println("e2e/node: skipping:", skipReason)
	}
	os.Exit(m.Run())
}

func need(t *testing.T) *nodeCluster {
	t.Helper()
	if cluster == nil {
		t.Skip(skipReason)
	}
	return cluster
}

func connect() (*nodeCluster, error) {
	c := &nodeCluster{kubeconfig: os.Getenv("LUAOP_TEST_NODE_KUBECONFIG"), repo: testcluster.RepoRoot()}
	dir := os.Getenv("LUAOP_TEST_NODE_DIR")
	if dir == "" {
		dir = filepath.Dir(c.kubeconfig)
	}
	env, err := readEnvFile(filepath.Join(dir, "node", "node.env"))
	if err != nil {
		return nil, fmt.Errorf("the node's description: %w (started by localcluster/node-up.sh?)", err)
	}
	c.env = env
	if c.cfg, err = clientcmd.BuildConfigFromFlags("", c.kubeconfig); err != nil {
		return nil, err
	}
	c.cfg.QPS, c.cfg.Burst = 100, 200
	if c.kube, err = kubernetes.NewForConfig(c.cfg); err != nil {
		return nil, err
	}
	if c.dyn, err = dynamic.NewForConfig(c.cfg); err != nil {
		return nil, err
	}
	// kubectl of the control plane's version, built by localcluster/build.sh.
	out, err := exec.Command(filepath.Join(c.repo, "localcluster", "build.sh")).Output()
	if err != nil {
		return nil, fmt.Errorf("localcluster/build.sh: %w", err)
	}
	c.kubectl = filepath.Join(strings.TrimSpace(string(out)), "kubectl")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.kube.CoreV1().Nodes().Get(ctx, env["NODE_NAME"], metaGet); err != nil {
		return nil, fmt.Errorf("the node %s: %w", env["NODE_NAME"], err)
	}
	return c, nil
}

// readEnvFile reads KEY=VALUE lines (values may be double-quoted).
func readEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok {
			env[k] = strings.Trim(v, `"`)
		}
	}
	return env, sc.Err()
}
