package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/testcluster"
)

// freeAddress is a loopback address with a port free now.
func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// `luaop run` as shipped: the example scripts against the test cluster, with its
// health, readiness, debug and metrics endpoints scraped as Kubernetes, Prometheus
// and `luaop status` would, and its JSON logs read as a log pipeline would.
func TestRunServesHealthReadinessDebugAndMetrics(t *testing.T) {
	env, root := exampleCluster(t)
	ns := env.Namespace(t)
	addr, metricsAddr := freeAddress(t), freeAddress(t)

	logs := &testcluster.LogBuffer{}
	logOutput = logs
	t.Cleanup(func() { logOutput = os.Stderr })
	v := viper.New()
	cmd := newRunCommand(v)
	cmd.Flags().String("config", "", "")
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if err := cmd.ParseFlags([]string{"--kubeconfig", kubeconfig, "--namespaces", ns, "--health-address", addr,
		"--metrics-address", metricsAddr, "--metrics-secure=false", "--post-events=false", "--log-level", "info",
		"--leader-elect", "--leader-election-namespace", ns, "--leader-election-name", "luaop-observed"}); err != nil {
		t.Fatal(err)
	}
	s, err := loadSettings(cmd, v)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- runOperator(ctx, s, filepath.Join(root, "scripts", "examples"), false) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("luaop run ended with %v", err)
		}
	})

	fetch := func(addr, path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		code, body := fetch(addr, "/readyz")
		return code == 200 && strings.Contains(body, "scripts "), fmt.Sprintf("/readyz: %d %s", code, body)
	})
	// The examples' on.probe decides readiness; liveness only with
	// --probes-affect-liveness.
	if code, body := fetch(addr, "/healthz"); code != 200 || !strings.Contains(body, `"status":"alive"`) {
		t.Errorf("/healthz: %d %s; want alive (the probes decide /readyz only)", code, body)
	}
	if code, _ := fetch(addr, "/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics on the health address: %d, want 404 (it has an address of its own)", code)
	}

	widgets := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}
	monitors := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "monitors"}
	create := func(gvr schema.GroupVersionResource, y string) string {
		docs, _ := testcluster.DecodeYAML(strings.NewReader(y))
		obj, err := env.Dynamic.Resource(gvr).Namespace(ns).Create(t.Context(), docs[0], metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(obj.GetUID())
	}
	widgetUID := create(widgets, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 2}}")
	create(monitors, "{apiVersion: examples.luaop.dev/v1, kind: Monitor, metadata: {name: m}, spec: {configmap: none, period: 60}}")

	const w = `widgets.examples.luaop.dev`
	want := []string{
		`controller_runtime_reconcile_total{controller="` + w + `",result="success"}`,
		`controller_runtime_reconcile_errors_total{controller="` + w + `"} 0`,
		`controller_runtime_reconcile_time_seconds_count{controller="` + w + `"}`,
		`controller_runtime_active_workers{controller="` + w + `"}`,
		`controller_runtime_max_concurrent_reconciles{controller="` + w + `"} 16`,
		`workqueue_adds_total{controller="` + w + `",name="` + w + `"}`,
		`workqueue_depth{controller="` + w + `",name="` + w + `",priority=""}`,
		`workqueue_queue_duration_seconds_count{controller="` + w + `",name="` + w + `"}`,
		`workqueue_work_duration_seconds_count{controller="` + w + `",name="` + w + `"}`,
		`workqueue_unfinished_work_seconds{controller="` + w + `",name="` + w + `"}`,
		`workqueue_longest_running_processor_seconds{controller="` + w + `",name="` + w + `"}`,
		`workqueue_retries_total{controller="monitors.examples.luaop.dev",name="monitors.examples.luaop.dev"}`,
		`rest_client_requests_total{code="200",host=`,
		`leader_election_master_status{name="luaop-observed"} 1`,
		`luaop_handler_runs_total{handler="greet",outcome="success",reason="create",resource="` + w + `"} 1`,
		`luaop_daemons_running{resource="monitors.examples.luaop.dev"} 1`,
		`luaop_reloads_total{result="ok"} 1`,
		`luaop_scripts_reload_failed 0`,
		`luaop_build_info{goversion="` + runtime.Version() + `",version=`,
		`luaop_events_received_total{resource="` + w + `",type="ADDED"}`,
		`luaop_patches_total{resource="` + w + `",result="ok",subresource="status"}`,
		`go_goroutines`,
	}
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		_, body := fetch(metricsAddr, "/metrics")
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false, "/metrics lacks " + w + "\n" + body
			}
		}
		// The greet handler succeeded: one successful reconcile at least.
		if strings.Contains(body, `controller_runtime_reconcile_total{controller="`+w+`",result="success"} 0`) {
			return false, "no successful reconcile of a widget yet"
		}
		return true, ""
	})

	// /debug, and `luaop status` reading it, show the running daemon.
	var doc debugDoc
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		d, body, err := fetchDebug(t.Context(), addr)
		doc = d
		return err == nil && len(d.Daemons) == 1, fmt.Sprintf("/debug: %v %s", err, body)
	})
	if d := doc.Daemons[0]; d.Resource != "monitors.examples.luaop.dev" || d.Namespace != ns || d.Name != "m" || d.Handler != "watcher" {
		t.Errorf("/debug daemon = %+v", d)
	}
	if doc.Election != "leader" {
		t.Errorf("/debug election = %q, want leader (--leader-elect, and no other replica)", doc.Election)
	}
	if doc.ScriptsHash == "" || len(doc.Handlers) < 6 || doc.LastReload == nil || !doc.LastReload.OK {
		t.Errorf("/debug lacks the scripts' hash, the handlers or the last reload: %+v", doc)
	}
	var out strings.Builder
	status := newStatusCommand()
	status.SetOut(&out)
	status.SetArgs([]string{"--address", addr})
	if err := status.Execute(); err != nil {
		t.Fatal(err)
	}
	t.Logf("luaop status:\n%s", out.String())
	for _, line := range []string{"scripts " + doc.ScriptsHash, "daemons (1):", "monitors.examples.luaop.dev  " + ns + "/m  watcher  running for"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("luaop status lacks %q:\n%s", line, out.String())
		}
	}

	// JSON log lines name the object field by field; successes are at debug in
	// production, and a version line comes first.
	var first, handlerLine map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		if first == nil {
			first = m
		}
		if m["msg"] == "handler succeeded" {
			t.Errorf("a success logged at info in production: %s", l)
		}
	}
	if first == nil || first["msg"] != "luaop starting" || first["version"] == nil {
		t.Errorf("the first log line is not the version line: %v", first)
	}
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		for _, l := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["handler"] == "greet" && strings.HasPrefix(fmt.Sprint(m["msg"]), "a widget was created") {
				handlerLine = m
				return true, ""
			}
		}
		return false, "no log line of the greet handler:\n" + logs.String()
	})
	for k, v := range map[string]any{"kind": "Widget", "namespace": ns, "name": "w", "uid": widgetUID, "handler": "greet"} {
		if handlerLine[k] != v {
			t.Errorf("log field %s = %v, want %v: %v", k, handlerLine[k], v, handlerLine)
		}
	}
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
	if err := env.InstallCRDs(t.Context(), filepath.Join(root, "scripts", "examples", "crds")); err != nil {
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
