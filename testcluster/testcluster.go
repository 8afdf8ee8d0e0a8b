package testcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/operator"
)

// Env is a connection to a test cluster.
type Env struct {
	Config  *rest.Config
	Dynamic dynamic.Interface
	Kube    kubernetes.Interface
}

// ErrNoCluster means no test cluster is configured and the tests were explicitly
// allowed to skip (LUAOP_TEST_NO_CLUSTER=1).
var ErrNoCluster = errors.New("no test cluster")

// Connect finds the test cluster: LUAOP_TEST_KUBECONFIG, else the project's local
// control plane (started if its binaries are built). With LUAOP_TEST_NO_CLUSTER=1 it
// returns ErrNoCluster instead, so that callers skip.
func Connect() (*Env, error) {
	if os.Getenv("LUAOP_TEST_NO_CLUSTER") == "1" {
		return nil, ErrNoCluster
	}
	path := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if path == "" {
		var err error
		if path, err = startLocalCluster(); err != nil {
			return nil, err
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("reading the test kubeconfig %s: %w", path, err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	env := &Env{Config: cfg}
	if env.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if env.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	// The request ServerVersion sends, with a deadline: a cluster that accepts the
	// connection and never answers fails here instead of hanging the tests.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := env.Kube.Discovery().RESTClient().Get().AbsPath("/version").Do(ctx).Raw(); err != nil {
		return nil, fmt.Errorf("the test cluster at %s does not answer: %w", cfg.Host, err)
	}
	return env, nil
}

// RepoRoot is the folder of go.mod above the working directory.
func RepoRoot() string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func startLocalCluster() (string, error) {
	root := RepoRoot()
	cmd := exec.Command(filepath.Join(root, "localcluster", "up.sh"))
	cmd.Env = append(os.Environ(), "LUAOP_NO_BUILD=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("no test cluster: LUAOP_TEST_KUBECONFIG is not set and the local control plane did not start (%v: %s); "+
			"run the tests with `make test`, which builds and starts it, or set LUAOP_TEST_NO_CLUSTER=1 to skip cluster tests", err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// Main is TestMain for packages that need the cluster: it connects, installs the
// CRDs found in crdPaths (files or folders of YAML), runs the tests, and exits.
func Main(m *testing.M, env **Env, crdPaths ...string) {
	e, err := Connect()
	if errors.Is(err, ErrNoCluster) {
		// The tests still run, each skipping itself (Env.Namespace and Env.Require on a nil
		// Env), so `go test -v` lists them as skipped instead of "ok" with none run.
		fmt.Println("testcluster: LUAOP_TEST_NO_CLUSTER=1: skipping the tests that need a cluster")
		os.Exit(m.Run())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testcluster:", err)
		os.Exit(1)
	}
	if err := e.InstallCRDs(context.Background(), crdPaths...); err != nil {
		fmt.Fprintln(os.Stderr, "testcluster: installing CRDs:", err)
		os.Exit(1)
	}
	*env = e
	os.Exit(m.Run())
}

// Require skips t when no cluster is configured (e is nil: LUAOP_TEST_NO_CLUSTER=1).
func (e *Env) Require(t testing.TB) {
	t.Helper()
	if e == nil {
		t.Skip("LUAOP_TEST_NO_CLUSTER=1: this test needs a cluster")
	}
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates or updates the CRDs in the given YAML files or folders and
// waits until each is Established and, when one was created, the server answers
// creates of its objects (past its warm-up of about 2 s).
func (e *Env) InstallCRDs(ctx context.Context, paths ...string) error {
	var objs []*unstructured.Unstructured
	for _, p := range paths {
		files := []string{p}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			files, _ = filepath.Glob(filepath.Join(p, "*.yaml"))
		}
		for _, f := range files {
			docs, err := ReadYAML(f)
			if err != nil {
				return err
			}
			objs = append(objs, docs...)
		}
	}
	created := false
	for _, crd := range objs {
		client := e.Dynamic.Resource(crdGVR)
		existing, err := client.Get(ctx, crd.GetName(), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if _, err := client.Create(ctx, crd, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("creating CRD %s: %w", crd.GetName(), err)
			}
			created = true
		case err != nil:
			return err
		default:
			crd.SetResourceVersion(existing.GetResourceVersion())
			if _, err := client.Update(ctx, crd, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("updating CRD %s: %w", crd.GetName(), err)
			}
		}
	}
	for _, crd := range objs {
		if err := waitEstablished(ctx, e.Dynamic, crd.GetName()); err != nil {
			return err
		}
		if created {
			if err := waitServed(ctx, e.Dynamic, crd); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitServed waits until the server answers creates of a new CRD's objects: right
// after Established it holds the first one for about 2 s (or answers 404), which
// would fall into a test's first timed wait. A dry-run create of an empty object is
// the probe, retried while 404: any other answer (even a schema error) means served.
func waitServed(ctx context.Context, dyn dynamic.Interface, crd *unstructured.Unstructured) error {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
	scope, _, _ := unstructured.NestedString(crd.Object, "spec", "scope")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		v, _ := v.(map[string]any)
		if served, _ := v["served"].(bool); !served {
			continue
		}
		version, _ := v["name"].(string)
		client := dyn.Resource(schema.GroupVersionResource{Group: group, Version: version, Resource: plural})
		var resource dynamic.ResourceInterface = client
		if scope != "Cluster" {
			resource = client.Namespace("default")
		}
		probe := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": group + "/" + version, "kind": kind,
			"metadata": map[string]any{"name": "luaop-served-probe"}}}
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := resource.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if !apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("CRD %s: creates of %s/%s still answered 404 after 30s: %w", crd.GetName(), version, plural, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		crd, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("CRD %s not Established after 30s", name)
}

// ReadYAML decodes every document of a YAML file.
func ReadYAML(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return DecodeYAML(f)
}

// DecodeYAML decodes a stream of YAML documents.
func DecodeYAML(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

var unsafeNameChars = regexp.MustCompile(`[^a-z0-9-]+`)

// Namespace creates a namespace for this test and deletes it when the test ends.
// Its name is the test's, cut to 40 characters, and a random number: subtests of one
// long name (the fault-injection harness makes hundreds) differ by the number only,
// so a name taken (by a sibling, or by a namespace of an earlier run still being
// deleted) is drawn again.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	e.Require(t)
	base := strings.Trim(unsafeNameChars.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 40 {
		base = base[:40]
	}
	var name string
	for attempt := 0; ; attempt++ {
		name = fmt.Sprintf("%s-%05d", strings.TrimRight(base, "-"), rand.IntN(100000))
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		_, err := e.Kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsAlreadyExists(err) || attempt == 20 {
			t.Fatalf("creating namespace %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		_ = e.Kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// RunningOperator is an operator started by a test, with its log captured.
type RunningOperator struct {
	*operator.Operator
	Log      *LogBuffer
	stop     context.CancelFunc
	done     chan error
	stopOnce sync.Once
	result   error
}

// Wait waits up to timeout for the operator to end by itself (a failed start) and
// returns what Start returned; it fails the test when it does not end.
func (r *RunningOperator) Wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(timeout):
		t.Fatalf("the operator did not end by itself within %s", timeout)
		return nil
	}
}

// Stop stops the operator and waits for it; it returns what Start returned. It may
// be called more than once (the test's cleanup calls it too).
func (r *RunningOperator) Stop() error {
	r.stopOnce.Do(func() {
		r.stop()
		r.result = <-r.done
	})
	return r.result
}

// StartOperator runs an operator in-process until the test ends (or Stop). Unless
// the options say otherwise it serves only the given namespace, posts no Events,
// and logs into a buffer that the test can search (and that is printed on failure).
func (e *Env) StartOperator(t testing.TB, namespace string, opts operator.Options) *RunningOperator {
	t.Helper()
	r := e.StartOperatorAsync(t, namespace, opts)
	Eventually(t, 20*time.Second, func() (bool, string) {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("the operator stopped at start: %v", err)
		default:
		}
		return r.Ready(), "the operator is not ready (scripts loaded, initial listing processed)"
	})
	return r
}

// StartOperatorAsync is StartOperator without waiting for readiness.
func (e *Env) StartOperatorAsync(t testing.TB, namespace string, opts operator.Options) *RunningOperator {
	t.Helper()
	buf := &LogBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(buf, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	if opts.Logger == nil {
		opts.Logger = log
	}
	if opts.Processing.Namespaces == nil && namespace != "" {
		opts.Processing.Namespaces = []string{namespace}
	}
	if opts.Processing.PostEvents == nil {
		f := false
		opts.Processing.PostEvents = &f
	}
	op, err := operator.New(e.Config, opts)
	if err != nil {
		t.Fatalf("creating the operator: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &RunningOperator{Operator: op, Log: buf, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- op.Start(ctx) }()
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

// testWriter sends log lines to t.Log, shown for failing tests or with -v.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// LogBuffer collects log output safely across goroutines.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything logged so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Eventually polls cond every 50 ms until it holds, or fails the test after timeout
// with the last message cond gave.
func Eventually(t testing.TB, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var msg string
	for {
		var ok bool
		ok, msg = cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
