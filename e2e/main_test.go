package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/state"
	"github.com/luaop/luaop/testcluster"
)

var env *testcluster.Env

func TestMain(m *testing.M) {
	root := testcluster.RepoRoot()
	testcluster.Main(m, &env,
		filepath.Join(root, "scripts", "examples", "crds"),
		filepath.Join(root, "e2e", "testdata", "crds"),
		filepath.Join(root, "scripts", "kopf-examples", "crd.yaml"))
}

var (
	widgets      = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}
	gadgets      = schema.GroupVersionResource{Group: "e2e.luaop.dev", Version: "v1", Resource: "gadgets"}
	strictThings = schema.GroupVersionResource{Group: "e2e.luaop.dev", Version: "v1", Resource: "strictthings"}
)

// script is a one-file script set.
func script(src string) []luabind.Script {
	return []luabind.Script{{Name: "test.lua", Source: []byte(src)}}
}

func startWith(t *testing.T, ns string, opts operator.Options) *testcluster.RunningOperator {
	t.Helper()
	if opts.Processing.ConsistencyTimeout == 0 {
		opts.Processing.ConsistencyTimeout = 5 * time.Second
	}
	return env.StartOperator(t, ns, opts)
}

func create(t *testing.T, gvr schema.GroupVersionResource, ns, yaml string) *unstructured.Unstructured {
	t.Helper()
	docs, err := testcluster.DecodeYAML(strings.NewReader(yaml))
	if err != nil || len(docs) != 1 {
		t.Fatalf("bad test YAML: %v", err)
	}
	obj, err := env.Dynamic.Resource(gvr).Namespace(ns).Create(t.Context(), docs[0], metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating %s: %v", docs[0].GetName(), err)
	}
	return obj
}

func get(t *testing.T, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	obj, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting %s/%s: %v", ns, name, err)
	}
	return obj
}

// waitField waits until the object's field (dotted path) equals want (compared as
// fmt %v), and returns the object.
func waitField(t *testing.T, gvr schema.GroupVersionResource, ns, name, path string, want any) *unstructured.Unstructured {
	t.Helper()
	var obj *unstructured.Unstructured
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		var err error
		obj, err = env.Dynamic.Resource(gvr).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, found, _ := unstructured.NestedFieldNoCopy(obj.Object, splitPath(path)...)
		return found && sameValue(got, want), "waiting for " + path + ": have " + show(got, found)
	})
	return obj
}

func sameValue(a, b any) bool { return show(a, true) == show(b, true) }

func show(v any, found bool) string {
	if !found {
		return "<absent>"
	}
	return strings.TrimSpace(strings.ReplaceAll(toJSON(v), "\n", ""))
}

// splitPath splits a dotted path; "\\." escapes a dot inside a key
// ("metadata.annotations.luaop\\.dev/x").
func splitPath(path string) []string {
	var parts []string
	var cur strings.Builder
	for i := 0; i < len(path); i++ {
		switch {
		case path[i] == '\\' && i+1 < len(path) && path[i+1] == '.':
			cur.WriteByte('.')
			i++
		case path[i] == '.':
			parts = append(parts, cur.String())
			cur.Reset()
		default:
			cur.WriteByte(path[i])
		}
	}
	return append(parts, cur.String())
}

func mustYAML(t testing.TB, y string) *unstructured.Unstructured {
	docs, err := testcluster.DecodeYAML(strings.NewReader(y))
	if err != nil || len(docs) != 1 {
		panic(fmt.Sprintf("bad test YAML %q: %v", y, err))
	}
	return docs[0]
}

func processingWith(progress state.ProgressStorage) processing.Options {
	return processing.Options{Progress: progress}
}

// startWithoutWaiting starts an operator without waiting for readiness (its
// resources may not exist yet).
func startWithoutWaiting(t *testing.T, ns string, opts operator.Options) *testcluster.RunningOperator {
	t.Helper()
	return env.StartOperatorAsync(t, ns, opts)
}

// diffBaseOf is the stored diff-base of an object, from whichever storage holds it:
// annotations, or status (the default for custom resources whose status keeps
// unknown fields).
func diffBaseOf(obj *unstructured.Unstructured) (string, bool) {
	if v, ok := obj.GetAnnotations()["luaop.dev/last-handled-configuration"]; ok {
		return v, true
	}
	v, ok, _ := unstructured.NestedString(obj.Object, "status", "luaop_dev", "last-handled-configuration")
	return v, ok
}

// progressOf is a handler's stored progress record as JSON, from either storage.
func progressOf(obj *unstructured.Unstructured, id string) (string, bool) {
	if v, ok := obj.GetAnnotations()["luaop.dev/"+id]; ok {
		return v, true
	}
	rec, ok, _ := unstructured.NestedMap(obj.Object, "status", "luaop_dev", "progress", id)
	if !ok {
		return "", false
	}
	data, _ := json.Marshal(rec)
	return string(data), true
}

// waitHandled waits until the object's stored diff-base is want (its last handled
// state), and returns the object.
func waitHandled(t *testing.T, gvr schema.GroupVersionResource, ns, name, want string) *unstructured.Unstructured {
	t.Helper()
	var obj *unstructured.Unstructured
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		var err error
		obj, err = env.Dynamic.Resource(gvr).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, ok := diffBaseOf(obj)
		return ok && got == want, "waiting for the handled state " + want + ": have " + got
	})
	return obj
}

// modificationsWithin counts the MODIFIED events of an object, from the version given,
// during d: how many writes handling it cost.
func modificationsWithin(t *testing.T, gvr schema.GroupVersionResource, ns string, obj *unstructured.Unstructured, d time.Duration) int {
	t.Helper()
	w, err := env.Dynamic.Resource(gvr).Namespace(ns).Watch(t.Context(), metav1.ListOptions{
		FieldSelector: "metadata.name=" + obj.GetName(), ResourceVersion: obj.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	modified := 0
	for timeout := time.After(d); ; {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == "MODIFIED" {
				modified++
			}
		case <-timeout:
			return modified
		}
	}
}
