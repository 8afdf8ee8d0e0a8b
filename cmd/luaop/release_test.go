package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// runLuaop runs the luaop command line in-process and returns its output.
func runLuaop(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	// Not t.Context(): cleanups run luaop too, and t.Context() is done by then.
	err := root.ExecuteContext(context.WithoutCancel(t.Context()))
	return out.String(), err
}

// The uninstall story of kopf's users: the operator put its finalizer on objects and
// is gone; objects deleted since are stuck. luaop release removes the finalizer (only
// its own), they are deleted; --purge also removes its annotations and status field;
// --prefix selects another operator's; --dry-run writes nothing.
func TestReleaseUnsticksObjectsLeftByTheOperator(t *testing.T) {
	env, root := exampleCluster(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	kubeconfig := testKubeconfig(t)
	examples := filepath.Join(root, "scripts", "examples")
	tenants := env.Dynamic.Resource(schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "tenants"}).Namespace(ns)
	widgets := env.Dynamic.Resource(schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)

	// The operator handles a Tenant (its delete handler needs the finalizer) and a Widget.
	v := viper.New()
	cmd := newRunCommand(v)
	if err := cmd.ParseFlags([]string{"--kubeconfig", kubeconfig, "-n", ns, "--health-address", "", "--metrics-address", "", "--post-events=false", "-q"}); err != nil {
		t.Fatal(err)
	}
	s, err := loadSettings(cmd, v)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runOperator(runCtx, s, examples, false) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("luaop run ended with %v", err)
			}
		}
	}
	t.Cleanup(stop)
	create := func(r interface {
		Create(context.Context, *unstructured.Unstructured, metav1.CreateOptions, ...string) (*unstructured.Unstructured, error)
	}, doc string) {
		t.Helper()
		objs, err := testcluster.DecodeYAML(strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Create(ctx, objs[0], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(tenants, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Tenant, metadata: {name: t1}, spec: {team: red, registry: %s}}", ns))
	create(widgets, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w1}, spec: {size: 1}}")
	get := func(r interface {
		Get(context.Context, string, metav1.GetOptions, ...string) (*unstructured.Unstructured, error)
	}, name string) *unstructured.Unstructured {
		t.Helper()
		obj, err := r.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return obj
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		t1, err := tenants.Get(ctx, "t1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		w1, err := widgets.Get(ctx, "w1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_, registered, _ := unstructured.NestedMap(t1.Object, "status", "register")
		_, greeted, _ := unstructured.NestedMap(w1.Object, "status", "greet")
		return slices.Contains(t1.GetFinalizers(), "luaop.dev/finalizer") && registered && greeted,
			fmt.Sprintf("not handled yet: tenant finalizers %v status %v; widget status %v", t1.GetFinalizers(), t1.Object["status"], w1.Object["status"])
	})
	stop()

	// Deleted without the operator: stuck on its finalizer.
	if err := tenants.Delete(ctx, "t1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if t1 := get(tenants, "t1"); t1.GetDeletionTimestamp() == nil {
		t.Fatalf("t1 is not being deleted: %v", t1.GetDeletionTimestamp())
	}
	// The Widget: another controller's finalizer next to luaop's and to another operator's.
	patch := `{"metadata":{"finalizers":["other.example/keep","luaop.dev/finalizer","ops.example.com/finalizer"],"annotations":{"luaop.dev/mine":"x","other.example/keep":"y"}}}`
	if _, err := widgets.Patch(ctx, "w1", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}

	// --dry-run: printed, nothing written.
	out, err := runLuaop(t, "release", "--kubeconfig", kubeconfig, "-n", ns, "--dry-run", examples)
	if err != nil {
		t.Fatalf("luaop release --dry-run: %v\n%s", err, out)
	}
	for _, want := range []string{"dry run", "would remove finalizer luaop.dev/finalizer", "examples.luaop.dev/v1/tenants " + ns + "/t1: would remove finalizer", "examples.luaop.dev/v1/tenants: 1 object(s), 1 would be released"} {
		if !strings.Contains(out, want) {
			t.Errorf("luaop release --dry-run printed\n%s\nwant %q", out, want)
		}
	}
	if strings.Contains(out, ": removed") || strings.Contains(out, "removing") {
		t.Errorf("luaop release --dry-run says it removed what it did not:\n%s", out)
	}
	if t1 := get(tenants, "t1"); !slices.Contains(t1.GetFinalizers(), "luaop.dev/finalizer") {
		t.Errorf("--dry-run removed the finalizer of t1: %v", t1.GetFinalizers())
	}

	// release: the stuck Tenant goes; the Widget keeps the other finalizers, the
	// annotations and the status.
	out, err = runLuaop(t, "release", "--kubeconfig", kubeconfig, "-n", ns, examples)
	if err != nil {
		t.Fatalf("luaop release: %v\n%s", err, out)
	}
	t.Logf("luaop release:\n%s", out)
	for _, want := range []string{"examples.luaop.dev/v1/tenants: 1 object(s), 1 released", "examples.luaop.dev/v1/widgets: 1 object(s), 1 released"} {
		if !strings.Contains(out, want) {
			t.Errorf("luaop release printed\n%s\nwant %q", out, want)
		}
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := tenants.Get(ctx, "t1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("the released tenant is still there (%v)", err)
	})
	w1 := get(widgets, "w1")
	if got := w1.GetFinalizers(); !slices.Equal(got, []string{"other.example/keep", "ops.example.com/finalizer"}) {
		t.Errorf("widget finalizers after release: %v, want the others' kept", got)
	}
	if _, ok := w1.GetAnnotations()["luaop.dev/mine"]; !ok {
		t.Errorf("release without --purge removed luaop's annotations: %v", w1.GetAnnotations())
	}
	if _, found, _ := unstructured.NestedMap(w1.Object, "status", "luaop_dev"); !found {
		t.Errorf("release without --purge removed status.luaop_dev: %v", w1.Object["status"])
	}

	// --purge: luaop's annotations and status field go; results and others' stay.
	out, err = runLuaop(t, "release", "--kubeconfig", kubeconfig, "-n", ns, "--purge", examples)
	if err != nil {
		t.Fatalf("luaop release --purge: %v\n%s", err, out)
	}
	w1 = get(widgets, "w1")
	for k := range w1.GetAnnotations() {
		if strings.HasPrefix(k, "luaop.dev/") {
			t.Errorf("--purge left the annotation %s", k)
		}
	}
	if _, ok := w1.GetAnnotations()["other.example/keep"]; !ok {
		t.Errorf("--purge removed another's annotation: %v", w1.GetAnnotations())
	}
	status, _, _ := unstructured.NestedMap(w1.Object, "status")
	if _, ok := status["luaop_dev"]; ok {
		t.Errorf("--purge left status.luaop_dev: %v", status)
	}
	if _, ok := status["greet"]; !ok {
		t.Errorf("--purge removed the handler's result status.greet: %v", status)
	}

	// Another operator's prefix, on a resource named by --resource (no scripts).
	out, err = runLuaop(t, "release", "--kubeconfig", kubeconfig, "-n", ns, "--prefix", "ops.example.com", "--resource", "examples.luaop.dev/v1/Widget")
	if err != nil {
		t.Fatalf("luaop release --prefix: %v\n%s", err, out)
	}
	if got := get(widgets, "w1").GetFinalizers(); !slices.Equal(got, []string{"other.example/keep"}) {
		t.Errorf("widget finalizers after release --prefix ops.example.com: %v\n%s", got, out)
	}
	// The other controller's finalizer, so that the namespace can go.
	if _, err := widgets.Patch(ctx, "w1", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestReleaseNeedsResources(t *testing.T) {
	if _, err := runLuaop(t, "release"); err == nil || !strings.Contains(err.Error(), "--resource") {
		t.Errorf("luaop release without DIR or --resource: %v", err)
	}
}

// The patches release sends: only the operator's finalizer, tested against the
// object's version; with purge its annotations and status field, on the status
// subresource when there is one.
func TestReleasePatches(t *testing.T) {
	obj := func(finalizers []any, annotations map[string]any, status map[string]any) *unstructured.Unstructured {
		m := map[string]any{"resourceVersion": "42", "name": "o"}
		if finalizers != nil {
			m["finalizers"] = finalizers
		}
		if annotations != nil {
			m["annotations"] = annotations
		}
		o := map[string]any{"metadata": m}
		if status != nil {
			o["status"] = status
		}
		return &unstructured.Unstructured{Object: o}
	}
	withLabels := func(o *unstructured.Unstructured, labels map[string]any) *unstructured.Unstructured {
		o.Object["metadata"].(map[string]any)["labels"] = labels
		return o
	}
	r := releaser{finalizer: "luaop.dev/finalizer", annotations: "luaop.dev/", shardLabel: "luaop.dev/shard", statusField: "luaop_dev"}
	purge := r
	purge.purge = true
	test := `{"op":"test","path":"/metadata/resourceVersion","value":"42"}`
	for _, tt := range []struct {
		name         string
		r            releaser
		obj          *unstructured.Unstructured
		subresource  bool
		meta, status string
		removed      string
	}{
		{"nothing of ours", r, obj([]any{"other/f"}, map[string]any{"luaop.dev/x": "1"}, map[string]any{"luaop_dev": map[string]any{}}), true, "", "", ""},
		{"our finalizer among others", r, obj([]any{"a/f", "luaop.dev/finalizer", "b/f"}, nil, nil), true,
			`[` + test + `,{"op":"replace","path":"/metadata/finalizers","value":["a/f","b/f"]}]`, "", "finalizer"},
		{"a finalizer of another prefix", r, obj([]any{"luaop.dev.other/finalizer", "luaop.dev/finalizers"}, nil, nil), true, "", "", ""},
		{"purge with a status subresource", purge, obj([]any{"luaop.dev/finalizer"}, map[string]any{"luaop.dev/greet": "{}", "luaop.dev.x/y": "k", "other/z": "k"}, map[string]any{"luaop_dev": map[string]any{}, "greet": "r"}), true,
			`[` + test + `,{"op":"replace","path":"/metadata/finalizers","value":[]},{"op":"remove","path":"/metadata/annotations/luaop.dev~1greet"}]`,
			`[{"op":"remove","path":"/status/luaop_dev"}]`, "finalizer, 1 annotation(s), status.luaop_dev"},
		{"the shard label without purge", r, withLabels(obj(nil, nil, nil), map[string]any{"luaop.dev/shard": "m1"}), true, "", "", ""},
		{"purge: the shard label, others' kept", purge, withLabels(obj(nil, nil, nil), map[string]any{"luaop.dev/shard": "m1", "luaop.dev/sharding": "x", "app": "a"}), true,
			`[` + test + `,{"op":"remove","path":"/metadata/labels/luaop.dev~1shard"}]`, "", "label luaop.dev/shard"},
		{"purge without a status subresource", purge, obj(nil, nil, map[string]any{"luaop_dev": "x"}), false,
			`[` + test + `,{"op":"remove","path":"/status/luaop_dev"}]`, "", "status.luaop_dev"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			meta, status, removed := tt.r.patches(tt.obj, tt.subresource)
			if string(meta) != tt.meta || string(status) != tt.status || strings.Join(removed, ", ") != tt.removed {
				t.Errorf("patches:\n meta   %s\n status %s\n removed %q\nwant\n meta   %s\n status %s\n removed %q", meta, status, removed, tt.meta, tt.status, tt.removed)
			}
		})
	}
}

// A sharded operator (--shard-across-replicas) labelled its objects with their
// replica (<prefix>/shard): luaop release refuses while a replica of its group
// holds its membership Lease; once it stopped, --purge removes the label with
// the handover annotation, and keeps the others' labels.
func TestReleasePurgeRemovesTheShardLabel(t *testing.T) {
	env, _ := exampleCluster(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	kubeconfig := testKubeconfig(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "widgets.lua"), []byte(`local luaop = require("luaop")
luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) return true end, { id = "seen" })
`), 0o644); err != nil {
		t.Fatal(err)
	}
	group := "purge"
	widgets := env.Dynamic.Resource(schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1", "labels": map[string]any{"app": "mine"}}, "spec": map[string]any{"size": int64(1)}}}
	if _, err := widgets.Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	root := newRootCommand()
	root.SetOut(&logs)
	root.SetErr(&logs)
	root.SetArgs([]string{"run", "--kubeconfig", kubeconfig, "-n", ns, "--shard-across-replicas", "--shard-namespace", ns, "--shard-group", group,
		"--health-address", "", "--metrics-address", "", "--post-events=false", "-q", dir})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(runCtx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("luaop run --shard-across-replicas ended with %v\n%s", err, logs.String())
			}
		}
	}
	t.Cleanup(stop)
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		got, err := widgets.Get(ctx, "w1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		seen, _, _ := unstructured.NestedBool(got.Object, "status", "seen")
		return got.GetLabels()["luaop.dev/shard"] != "" && seen, fmt.Sprintf("not labelled and handled yet: %v %v", got.GetLabels(), got.Object["status"])
	})

	args := []string{"release", "--kubeconfig", kubeconfig, "-n", ns, "--purge", "--shard-group", group, dir}
	if out, err := runLuaop(t, args...); err == nil || !strings.Contains(err.Error(), "shard group "+group) || !strings.Contains(err.Error(), "in namespace "+ns) {
		t.Errorf("luaop release while a sharded replica runs: %v, want it refused naming the group and the namespace\n%s", err, out)
	}
	stop()
	// A handover the coordinator had marked when the operator stopped.
	if _, err := widgets.Patch(ctx, "w1", types.MergePatchType, []byte(`{"metadata":{"annotations":{"luaop.dev/shard-handover":"gone"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := runLuaop(t, args...)
	if err != nil {
		t.Fatalf("luaop release --purge: %v\n%s", err, out)
	}
	if !strings.Contains(out, "/w1: removed 1 annotation(s), label luaop.dev/shard, status.luaop_dev") {
		t.Errorf("luaop release --purge does not say it removed the shard label:\n%s", out)
	}
	got, err := widgets.Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := got.GetLabels(); l["luaop.dev/shard"] != "" || l["app"] != "mine" {
		t.Errorf("labels after --purge: %v, want the shard label gone and app=mine kept", l)
	}
	for k := range got.GetAnnotations() {
		if strings.HasPrefix(k, "luaop.dev/") {
			t.Errorf("--purge left the annotation %s", k)
		}
	}
}

// Issue 45: a dry run says what it would remove, not that it removed it (the server
// stored nothing); a real run says what it removed.
func TestReleaseObjectSaysWouldRemoveInADryRun(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "tenants"}
	for _, tt := range []struct {
		dryRun bool
		want   string
	}{{true, "would remove finalizer"}, {false, "removed finalizer"}} {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Tenant",
			"metadata": map[string]any{"name": "t1", "namespace": "team-a", "resourceVersion": "42", "finalizers": []any{"luaop.dev/finalizer"}}}}
		dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "TenantList"}, obj.DeepCopy())
		r := releaser{dyn: dyn, finalizer: "luaop.dev/finalizer", annotations: "luaop.dev/", shardLabel: "luaop.dev/shard", statusField: "luaop_dev", dryRun: tt.dryRun}
		got, err := r.releaseObject(t.Context(), processing.ResolvedResource{GVR: gvr, Namespaced: true, StatusSubresource: true}, obj)
		if err != nil || got != tt.want {
			t.Errorf("dry run %v: %q, %v; want %q", tt.dryRun, got, err, tt.want)
		}
	}
}
