package e2e

// kopf's own example operators (its examples/01-17 and 99), written in Lua in
// scripts/kopf-examples/NN-name/example.lua, run on the real API server and checked
// the way kopf's tests/e2e/test_examples.py checks kopf's: the operator does not die,
// the finalizer is added and the deletion handled when a delete handler needs it,
// every handler that succeeds does so exactly once (or as many times as the example
// declares), failures count as declared, and no error is logged unless the example
// allows it. What each example declares besides is in its e2e.yaml (keys in
// scripts/kopf-examples/README.md): log lines, results, Events, probes, children,
// webhooks' verdicts.

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/testcluster"
)

var (
	kopfExamples = schema.GroupVersionResource{Group: "kopf.dev", Version: "v1", Resource: "kopfexamples"}
	pods         = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// kopfExample is an example's e2e.yaml.
type kopfExample struct {
	// Object is the object created and deleted (default ../obj.yaml); Before, objects
	// that exist before the operator starts.
	Object string   `json:"object"`
	Before []string `json:"before"`
	// Update is a merge patch of the object applied after its creation is handled.
	Update string `json:"update"`
	// SuccessCounts and FailureCounts: how many "handler succeeded" and "handler
	// failed for good" lines each handler named logs; nil: every handler that
	// succeeds does so once, none fails for good (kopf's E2E_SUCCESS_COUNTS, ...).
	SuccessCounts *map[string]int `json:"success_counts"`
	FailureCounts *map[string]int `json:"failure_counts"`
	// AllowErrors allows lines at level ERROR (kopf's E2E_ALLOW_TRACEBACKS).
	AllowErrors bool `json:"allow_errors"`
	// Lines that must be logged: once the operator started, once the creation is
	// handled, after the update, after the deletion, by the end.
	StartupLogged  []string `json:"startup_logged"`
	CreationLogged []string `json:"creation_logged"`
	UpdateLogged   []string `json:"update_logged"`
	DeletionLogged []string `json:"deletion_logged"`
	Logged         []string `json:"logged"`
	NotLogged      []string `json:"not_logged"`
	// What the object holds once its creation is handled (subsets).
	Status map[string]any `json:"status"`
	Spec   map[string]any `json:"spec"`
	// Children are objects labelled so in the namespace.
	Children *struct {
		Kind  string `json:"kind"`
		Label string `json:"label"`
		Count int    `json:"count"`
	} `json:"children"`
	// Events about the object (subsets of type, reason, message).
	Events []map[string]string `json:"events"`
	// Probes are what /healthz reports by probe id ("<namespace>" stands for the
	// test's namespace).
	Probes map[string]any `json:"probes"`
	// Webhooks serves the admission handlers; Warnings are what the creation's
	// client is warned of; Rejected are objects (or status patches) refused.
	Webhooks bool     `json:"webhooks"`
	Warnings []string `json:"warnings"`
	Rejected []struct {
		Spec    map[string]any `json:"spec"`
		Status  map[string]any `json:"status"`
		Message string         `json:"message"`
		Code    int32          `json:"code"`
	} `json:"rejected"`
}

func TestKopfExamples(t *testing.T) {
	root := filepath.Join(testcluster.RepoRoot(), "scripts", "kopf-examples")
	dirs, err := filepath.Glob(filepath.Join(root, "[0-9][0-9]-*"))
	if err != nil || len(dirs) < 18 {
		t.Fatalf("kopf examples in %s: %v (%v)", root, dirs, err)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) { runKopfExample(t, dir) })
	}
}

// jsonLines is the operator's JSON log, parsed.
type jsonLines struct {
	mu  sync.Mutex
	raw strings.Builder
}

func (l *jsonLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.raw.Write(p)
}

func (l *jsonLines) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(l.raw.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(s), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// logged tells whether some line's message contains text.
func (l *jsonLines) logged(text string) bool {
	for _, m := range l.lines() {
		if strings.Contains(fmt.Sprint(m["msg"]), text) {
			return true
		}
	}
	return false
}

// count counts the lines of msg by handler.
func (l *jsonLines) count(msg string) map[string]int {
	out := map[string]int{}
	for _, m := range l.lines() {
		if m["msg"] == msg && m["handler"] != nil {
			out[fmt.Sprint(m["handler"])]++
		}
	}
	return out
}

func (l *jsonLines) waitLogged(t *testing.T, when string, texts []string) {
	t.Helper()
	for _, text := range texts {
		testcluster.Eventually(t, 40*time.Second, func() (bool, string) {
			return l.logged(text), fmt.Sprintf("%s: waiting for a log line with %q", when, text)
		})
	}
}

func readYAML(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return mustYAML(t, string(data))
}

func gvrOf(obj *unstructured.Unstructured) schema.GroupVersionResource {
	if obj.GetKind() == "Pod" {
		return pods
	}
	return kopfExamples
}

// servesObject tells whether a handler's resource (as the script spells it) is the
// object's.
func servesObject(spec causes.Spec, obj *unstructured.Unstructured) bool {
	names := []string{"kopfexamples", "kopfexample", "KopfExample", "kopfexes", "kopfex", "kexes", "kex"}
	if obj.GetKind() == "Pod" {
		names = []string{"pods", "pod", "Pod", "po"}
	}
	return slices.Contains(names, spec.Resource.Resource)
}

func runKopfExample(t *testing.T, dir string) {
	var ex kopfExample
	if data, err := os.ReadFile(filepath.Join(dir, "e2e.yaml")); err != nil {
		t.Fatal(err)
	} else if err := yaml.Unmarshal(data, &ex); err != nil {
		t.Fatalf("e2e.yaml: %v", err)
	}
	ns := env.Namespace(t)
	ctx := t.Context()
	for _, path := range ex.Before {
		createEventually(t, ns, readYAML(t, filepath.Join(dir, path)))
	}

	// kopf's e2e test runs with default_backoff = 1 ("to prevent lengthy sleeps on
	// the simulated retries"), verbosely, posting Events.
	logs := &jsonLines{}
	post := true
	logger := slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testWriterFor(t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	r := env.StartOperator(t, ns, operator.Options{
		ScriptsDir: dir, ProbeCache: -1, Logger: logger,
		Processing: processing.Options{DefaultBackoff: time.Second, PostEvents: &post, ConsistencyTimeout: 5 * time.Second},
	})
	logs.waitLogged(t, "startup", ex.StartupLogged)

	obj := readYAML(t, filepath.Join(dir, "..", "obj.yaml"))
	if ex.Object != "" {
		obj = readYAML(t, filepath.Join(dir, ex.Object))
	}
	gvr := gvrOf(obj)
	var specs []causes.Spec
	for _, s := range r.Runtime().Specs() {
		if servesObject(s, obj) {
			specs = append(specs, s)
		}
	}
	hasCreate, needsFinalizer, hasChange := false, false, false
	for _, s := range specs {
		hasCreate = hasCreate || s.Kind == causes.KindChange && s.Serves(causes.Create)
		hasChange = hasChange || s.Kind == causes.KindChange
		needsFinalizer = needsFinalizer || s.RequiresFinalizer()
	}

	client := env.Dynamic
	warnings := &warningCollector{}
	if ex.Webhooks {
		cfg := rest.CopyConfig(env.Config)
		cfg.WarningHandler = warnings
		var err error
		if client, err = dynamic.NewForConfig(cfg); err != nil {
			t.Fatal(err)
		}
		startExampleWebhooks(t, r, ns, logger)
		// The configurations reach the API server's informer shortly after they are
		// written: the first rejection says the webhooks are called.
		first := ex.Rejected[0]
		probe := obj.DeepCopy()
		probe.SetName("webhook-probe")
		probe.Object["spec"] = first.Spec
		testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
			_, err := env.Dynamic.Resource(gvr).Namespace(ns).Create(ctx, probe.DeepCopy(), metav1.CreateOptions{})
			if err == nil {
				_ = env.Dynamic.Resource(gvr).Namespace(ns).Delete(ctx, probe.GetName(), metav1.DeleteOptions{})
				return false, "created: the webhooks are not called yet"
			}
			return !apierrors.IsAlreadyExists(err), err.Error()
		})
	}

	created := createEventuallyWith(t, client, gvr, ns, obj)
	name := created.GetName()
	switch {
	case len(ex.CreationLogged) > 0:
		logs.waitLogged(t, "creation", ex.CreationLogged)
	case hasCreate:
		testcluster.Eventually(t, 40*time.Second, func() (bool, string) {
			o, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			_, done := diffBaseOf(o)
			return done, "waiting for the creation to be handled (its diff-base stored)"
		})
	}
	current, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if has := slices.Contains(current.GetFinalizers(), "luaop.dev/finalizer"); has != needsFinalizer {
		t.Errorf("finalizer on the object: %v, want %v (a delete handler, daemon or timer needs it)", has, needsFinalizer)
	}
	checkKopfExampleObject(t, ex, r, current, ns, warnings)

	if ex.Update != "" {
		if _, err := env.Dynamic.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(ex.Update), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		logs.waitLogged(t, "update", ex.UpdateLogged)
	}

	if err := env.Dynamic.Resource(gvr).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 40*time.Second, func() (bool, string) {
		_, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("%s still exists (%v)", name, err)
	})
	// The operator saw the DELETED event (kopf: "Deleted, really deleted, and we are
	// notified."), when it watches the object: whatever followed the deletion has run.
	testcluster.Eventually(t, 40*time.Second, func() (bool, string) {
		if len(specs) == 0 {
			return true, ""
		}
		for _, m := range logs.lines() {
			if m["msg"] == "deleted, really deleted, and the operator is notified" && m["name"] == name {
				return true, ""
			}
		}
		return false, "waiting for the operator to see the DELETED event of " + name
	})
	logs.waitLogged(t, "deletion", ex.DeletionLogged)
	for _, path := range ex.Before {
		before := readYAML(t, filepath.Join(dir, path))
		_ = env.Dynamic.Resource(gvrOf(before)).Namespace(ns).Delete(ctx, before.GetName(), metav1.DeleteOptions{})
	}

	// The operator stops (cleanup handlers run) without an error of its own.
	if err := r.Stop(); err != nil {
		t.Errorf("the operator ended with %v", err)
	}
	checkKopfExampleLog(t, ex, logs, specs, hasCreate, hasChange)
}

// checkKopfExampleLog checks the whole log as kopf's test_examples.py checks the
// operator's output.
func checkKopfExampleLog(t *testing.T, ex kopfExample, logs *jsonLines, specs []causes.Spec, hasCreate, hasChange bool) {
	t.Helper()
	reasons := map[string]bool{}
	for _, m := range logs.lines() {
		msg := fmt.Sprint(m["msg"])
		if strings.HasPrefix(msg, "handler ") || msg == "running handler" {
			reasons[fmt.Sprint(m["reason"])] = true
		}
		if strings.Contains(msg, "internal error") || strings.Contains(msg, "panic") {
			t.Errorf("an internal error: %v", m)
		}
		if m["level"] == "ERROR" && !ex.AllowErrors {
			t.Errorf("an error was logged (the example allows none): %v", m)
		}
	}
	if hasCreate && !reasons["create"] {
		t.Error("no create handler ran (kopf: \"Creation is in progress\")")
	}
	for _, s := range specs {
		if s.Kind == causes.KindChange && s.Serves(causes.Delete) && !s.Optional && !reasons["delete"] {
			t.Error("no delete handler ran (kopf: \"Deletion is in progress\")")
			break
		}
	}
	succeeded := logs.count("handler succeeded")
	if ex.SuccessCounts != nil {
		got := map[string]int{}
		for id := range *ex.SuccessCounts {
			if succeeded[id] > 0 {
				got[id] = succeeded[id]
			}
		}
		if want := *ex.SuccessCounts; len(want) > 0 && !reflect.DeepEqual(got, want) {
			t.Errorf("handlers succeeded %v times, want %v (all: %v)", got, want, succeeded)
		}
	} else {
		for id, n := range succeeded {
			if n != 1 {
				t.Errorf("handler %s succeeded %d times, want once (all: %v)", id, n, succeeded)
			}
		}
		if len(succeeded) == 0 && (hasCreate || hasChange) {
			t.Error("no handler succeeded")
		}
	}
	failed := logs.count("handler failed for good")
	want := map[string]int{}
	if ex.FailureCounts != nil {
		want = *ex.FailureCounts
	}
	if len(failed) != len(want) || !reflect.DeepEqual(failed, want) && len(want) > 0 {
		t.Errorf("handlers failed for good %v times, want %v", failed, want)
	}
	for _, text := range ex.Logged {
		if !logs.logged(text) {
			t.Errorf("no log line with %q", text)
		}
	}
	for _, text := range ex.NotLogged {
		if logs.logged(text) {
			t.Errorf("a log line with %q", text)
		}
	}
}

// checkKopfExampleObject checks what the handled object holds, and around it.
func checkKopfExampleObject(t *testing.T, ex kopfExample, r *testcluster.RunningOperator, obj *unstructured.Unstructured, ns string, warnings *warningCollector) {
	t.Helper()
	ctx := t.Context()
	gvr := gvrOf(obj)
	for field, want := range map[string]map[string]any{"status": ex.Status, "spec": ex.Spec} {
		if want == nil {
			continue
		}
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			o, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(ctx, obj.GetName(), metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got, _ := o.Object[field].(map[string]any)
			return containsJSON(got, want), fmt.Sprintf("%s %v, want %v in it", field, got, want)
		})
	}
	if c := ex.Children; c != nil {
		testcluster.Eventually(t, 40*time.Second, func() (bool, string) {
			list, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: c.Label})
			if err != nil {
				return false, err.Error()
			}
			owned := 0
			for _, p := range list.Items {
				for _, ref := range p.OwnerReferences {
					if ref.UID == obj.GetUID() {
						owned++
					}
				}
			}
			return owned == c.Count, fmt.Sprintf("%d %ss owned by the object with %s, want %d", owned, c.Kind, c.Label, c.Count)
		})
	}
	for _, want := range ex.Events {
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			list, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(obj.GetUID())})
			if err != nil {
				return false, err.Error()
			}
			var seen []string
			for _, e := range list.Items {
				if (want["type"] == "" || e.Type == want["type"]) && (want["reason"] == "" || e.Reason == want["reason"]) &&
					(want["message"] == "" || e.Message == want["message"]) {
					return true, ""
				}
				seen = append(seen, e.Type+"/"+e.Reason+"/"+e.Message)
			}
			return false, fmt.Sprintf("no Event %v among %v", want, seen)
		})
	}
	if ex.Probes != nil {
		want := map[string]any{}
		data, _ := json.Marshal(ex.Probes)
		_ = json.Unmarshal([]byte(strings.ReplaceAll(string(data), `\u003cnamespace\u003e`, ns)), &want) // json escapes < and >
		testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
			got, healthy := r.Probe(ctx)
			return healthy && containsJSON(got, want), fmt.Sprintf("probes %v (healthy %v), want %v", got, healthy, want)
		})
	}
	for _, w := range ex.Warnings {
		if !strings.Contains(warnings.all(), w) {
			t.Errorf("the client was not warned %q (warnings: %q)", w, warnings.all())
		}
	}
	for _, rej := range ex.Rejected {
		var err error
		if rej.Status != nil {
			_, err = env.Dynamic.Resource(gvr).Namespace(ns).Patch(ctx, obj.GetName(), types.MergePatchType,
				[]byte(toJSON(map[string]any{"status": rej.Status})), metav1.PatchOptions{}, "status")
		} else {
			bad := obj.DeepCopy()
			bad.SetName("rejected")
			bad.SetResourceVersion("")
			bad.SetUID("")
			bad.Object["spec"] = rej.Spec
			delete(bad.Object, "status")
			_, err = env.Dynamic.Resource(gvr).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{})
		}
		var status apierrors.APIStatus
		switch {
		case err == nil:
			t.Errorf("%v was not rejected", rej)
		case !strings.Contains(err.Error(), rej.Message):
			t.Errorf("%v rejected with %v, want %q", rej, err, rej.Message)
		case rej.Code != 0 && (!asAPIStatus(err, &status) || status.Status().Code != rej.Code):
			t.Errorf("%v rejected with %v, want the code %d", rej, err, rej.Code)
		}
	}
}

func asAPIStatus(err error, out *apierrors.APIStatus) bool {
	s, ok := err.(apierrors.APIStatus)
	*out = s
	return ok
}

// containsJSON tells whether got holds want: maps as subsets, anything else equal
// (through JSON, so that numbers compare by value).
func containsJSON(got, want any) bool {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return false
		}
		for k, v := range w {
			if !containsJSON(g[k], v) {
				return false
			}
		}
		return true
	}
	a, _ := json.Marshal(got)
	b, _ := json.Marshal(want)
	var x, y any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	return reflect.DeepEqual(x, y)
}

// createEventually creates obj in ns, retrying while the namespace is not ready for
// it (a Pod needs the namespace's default ServiceAccount, which the controller
// manager makes shortly after the namespace).
func createEventually(t *testing.T, ns string, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	return createEventuallyWith(t, env.Dynamic, gvrOf(obj), ns, obj)
}

func createEventuallyWith(t *testing.T, client dynamic.Interface, gvr schema.GroupVersionResource, ns string, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	var created *unstructured.Unstructured
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		var err error
		created, err = client.Resource(gvr).Namespace(ns).Create(t.Context(), obj.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			return false, fmt.Sprintf("creating %s: %v", obj.GetName(), err)
		}
		return true, ""
	})
	return created
}

// startExampleWebhooks serves the operator's admission handlers on loopback,
// registered with the API server under a prefix of the namespace's; removed when the
// test ends. The handlers' ctx.logger writes to the server's logger: the
// operator's log.
func startExampleWebhooks(t *testing.T, r *testcluster.RunningOperator, ns string, logger *slog.Logger) {
	t.Helper()
	serveWebhooks(t, r, ns, ns+".e2e.luaop.dev", admission.Options{Logger: logger})
}
