package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/testcluster"
)

// `luaop run` as shipped: the example scripts against the test cluster, with its
// health, readiness and metrics endpoints scraped as Kubernetes and Prometheus would.
func TestRunServesHealthReadinessAndMetrics(t *testing.T) {
	env, root := exampleCluster(t)
	ns := env.Namespace(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	v := viper.New()
	cmd := newRunCommand(v)
	cmd.Flags().String("config", "", "")
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if err := cmd.ParseFlags([]string{"--kubeconfig", kubeconfig, "--namespaces", ns, "--health-address", addr,
		"--post-events=false", "--log-level", "warn"}); err != nil {
		t.Fatal(err)
	}
	s, err := loadSettings(cmd, v)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runOperator(ctx, s, filepath.Join(root, "scripts", "examples"), false) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("luaop run ended with %v", err)
		}
	})

	fetch := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		code, body := fetch("/readyz")
		return code == 200 && strings.Contains(body, "scripts "), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	if code, body := fetch("/healthz"); code != 200 || !strings.Contains(body, `"now":"20`) {
		t.Errorf("/healthz: %d %s; want the on.probe result under \"now\"", code, body)
	}

	widgets := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}
	docs, _ := testcluster.DecodeYAML(strings.NewReader("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 2}}"))
	if _, err := env.Dynamic.Resource(widgets).Namespace(ns).Create(context.Background(), docs[0], metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`luaop_handler_runs_total{handler="greet",outcome="success",reason="create",resource="examples.luaop.dev/v1/widgets"} 1`,
		`luaop_reloads_total{result="ok"} 1`,
		`luaop_events_received_total{resource="examples.luaop.dev/v1/widgets",type="ADDED"}`,
		`luaop_patches_total{resource="examples.luaop.dev/v1/widgets",result="ok",subresource="status"}`,
		`workqueue_adds_total{name="luaop"}`,
		`go_goroutines`,
	}
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		_, body := fetch("/metrics")
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false, "/metrics lacks " + w
			}
		}
		return true, ""
	})
}

// exampleCluster connects to the test cluster (skipping without one) with the example
// CRDs installed, and returns the repository's root.
func exampleCluster(t *testing.T) (*testcluster.Env, string) {
	t.Helper()
	env, err := testcluster.Connect()
	if errors.Is(err, testcluster.ErrNoCluster) {
		t.Skip("LUAOP_TEST_NO_CLUSTER=1: this test needs a cluster")
	}
	if err != nil {
		t.Fatal(err)
	}
	root := testcluster.RepoRoot()
	if err := env.InstallCRDs(context.Background(), filepath.Join(root, "scripts", "examples", "crds")); err != nil {
		t.Fatal(err)
	}
	return env, root
}

// KUBECONFIG as a list (a missing file first, as kubectl allows) reaches the cluster.
func TestKubeconfigListReachesCluster(t *testing.T) {
	exampleCluster(t)
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		t.Skip("the test cluster is not given by LUAOP_TEST_KUBECONFIG")
	}
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "absent")+string(os.PathListSeparator)+kubeconfig)
	s, err := parseSettings(t)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := restConfig(s)
	if err != nil {
		t.Fatalf("KUBECONFIG=%s: %v", os.Getenv("KUBECONFIG"), err)
	}
	if err := checkReachable(cfg); err != nil {
		t.Fatalf("KUBECONFIG=%s: %v", os.Getenv("KUBECONFIG"), err)
	}
}
