package caching

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	testingclock "k8s.io/utils/clock/testing"
)

var cmGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func configMap(ns, name, rv string, lbls map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + ns + "-" + name))
	u.SetResourceVersion(rv)
	u.SetLabels(lbls)
	return u
}

type fixture struct {
	cache *Cache
	dyn   *dynamicfake.FakeDynamicClient
	clock *testingclock.FakeClock
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{cmGVR: "ConfigMapList"}, objs...)
	clock := testingclock.NewFakeClock(time.Now())
	c := New(dyn, nil, Options{Clock: clock, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(c.Wait)
	return &fixture{cache: c, dyn: dyn, clock: clock}
}

func (f *fixture) acquire(t *testing.T, v View, serves bool) *Handle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h, err := f.cache.Acquire(ctx, v, serves)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func names(items []map[string]any) string {
	var out []string
	for _, it := range items {
		m := metaOf(it)
		out = append(out, str(m["namespace"])+"/"+str(m["name"]))
	}
	return strings.Join(out, ",")
}

func TestReadsOfAWholeView(t *testing.T) {
	f := newFixture(t, configMap("a", "one", "10", map[string]string{"app": "web"}), configMap("b", "two", "11", map[string]string{"app": "db"}),
		configMap("a", "three", "12", nil))
	f.acquire(t, View{Resource: cmGVR}, true)
	ctx := t.Context()

	got, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"})
	if err != nil || metaOf(got)["name"] != "one" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	_, err = f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "missing"})
	if !apierrors.IsNotFound(err) || strings.Contains(err.Error(), "holds only") {
		t.Errorf("a miss of a whole view: %v, want a plain NotFound", err)
	}
	list, err := f.cache.List(ctx, Query{Resource: cmGVR})
	if err != nil || names(list) != "a/one,a/three,b/two" {
		t.Errorf("List all = %q, %v; want every object, sorted", names(list), err)
	}
	list, _ = f.cache.List(ctx, Query{Resource: cmGVR, Namespace: "a"})
	if names(list) != "a/one,a/three" {
		t.Errorf("List in a = %q", names(list))
	}
	for sel, want := range map[string]string{"app=web": "a/one", "app in (web,db)": "a/one,b/two", "app": "a/one,b/two", "!app": "a/three", "app!=web": "a/three,b/two"} {
		list, err := f.cache.List(ctx, Query{Resource: cmGVR, Selector: mustParse(sel)})
		if err != nil || names(list) != want {
			t.Errorf("List %q = %q, %v; want %q", sel, names(list), err, want)
		}
	}
	if _, err := f.cache.Get(ctx, Query{Resource: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: "a", Name: "x"}); !errors.Is(err, ErrNotCached) {
		t.Errorf("a resource no view holds: %v, want ErrNotCached", err)
	}
}

// A list that selects by a label's value goes through an index of that label,
// added on the first such list, and kept up to date by the informer.
func TestListsBySelectorUseAnIndexOfTheLabel(t *testing.T) {
	f := newFixture(t, configMap("a", "one", "10", map[string]string{"owner": "x"}), configMap("a", "two", "11", map[string]string{"owner": "y"}))
	h := f.acquire(t, View{Resource: cmGVR}, true)
	list, err := f.cache.List(t.Context(), Query{Resource: cmGVR, Selector: mustParse("owner=x")})
	if err != nil || names(list) != "a/one" {
		t.Fatalf("List = %q, %v", names(list), err)
	}
	if _, ok := h.Informer().GetIndexer().GetIndexers()[labelIndex("owner")]; !ok {
		t.Fatalf("no index of the label: %v", h.Informer().GetIndexer().GetIndexers())
	}
	if _, err := f.dyn.Resource(cmGVR).Namespace("a").Create(t.Context(), configMap("a", "three", "12", map[string]string{"owner": "x"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.cache.Wrote(cmGVR, "a", "three", configMap("a", "three", "12", map[string]string{"owner": "x"}).Object)
	list, _ = f.cache.List(t.Context(), Query{Resource: cmGVR, Selector: mustParse("owner=x")})
	if names(list) != "a/one,a/three" {
		t.Errorf("after a create, List = %q", names(list))
	}
}

// A view that selects by label answers what it holds; a miss, and a list it does
// not hold completely, are read from the API server (ErrNotCached): a selected
// watch of one script must not change what another script's read returns. It is
// said once, with what to declare.
func TestReadsOfASelectedView(t *testing.T) {
	f := newFixture(t, configMap("a", "src", "10", map[string]string{"replicate": "true"}), configMap("a", "plain", "11", nil))
	var logs strings.Builder
	f.cache.log = slog.New(slog.NewTextHandler(&logs, nil))
	f.acquire(t, View{Resource: cmGVR, LabelSelector: "replicate=true"}, true)
	ctx := t.Context()
	if _, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "src"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		_, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "plain"})
		if !errors.Is(err, ErrNotCached) || !errors.Is(err, ErrPartial) || !strings.Contains(err.Error(), "labelled replicate=true") {
			t.Errorf("a miss of a selected view: %v; want ErrNotCached (read from the API server) saying what the cache holds", err)
		}
	}
	list, err := f.cache.List(ctx, Query{Resource: cmGVR, Namespace: "a", Selector: mustParse("replicate=true,x")})
	if err != nil || names(list) != "" {
		t.Errorf("a list the view holds: %q, %v", names(list), err)
	}
	_, err = f.cache.List(ctx, Query{Resource: cmGVR, Namespace: "a"})
	if !errors.Is(err, ErrNotCached) || !errors.Is(err, ErrPartial) {
		t.Errorf("a list the view holds in part: %v, want ErrNotCached and ErrPartial", err)
	}
	if n := strings.Count(logs.String(), "declare luaop.reads"); n != 2 {
		t.Errorf("the partial get and list said %d times, want once each:\n%s", n, logs.String())
	}
	// A second view (a declared read) makes both answerable.
	f.acquire(t, View{Resource: cmGVR}, true)
	if _, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "plain"}); err != nil {
		t.Errorf("with a whole view: %v", err)
	}
	if list, err := f.cache.List(ctx, Query{Resource: cmGVR, Namespace: "a"}); err != nil || names(list) != "a/plain,a/src" {
		t.Errorf("with a whole view: %q, %v", names(list), err)
	}
}

// A view whose holder does not let it serve reads (a replica's share of sharded
// objects) answers none; releasing the last handle stops the view.
func TestOnlyServingViewsAnswerReads(t *testing.T) {
	f := newFixture(t, configMap("a", "one", "10", nil))
	h := f.acquire(t, View{Resource: cmGVR, Namespace: "a"}, false)
	if _, err := f.cache.Get(t.Context(), Query{Resource: cmGVR, Namespace: "a", Name: "one"}); !errors.Is(err, ErrNotCached) {
		t.Errorf("a view that serves no reads answered: %v", err)
	}
	served := f.acquire(t, View{Resource: cmGVR, Namespace: "a"}, true)
	if served.Informer() != h.Informer() {
		t.Fatal("two holds of one view have two informers")
	}
	if _, err := f.cache.Get(t.Context(), Query{Resource: cmGVR, Namespace: "a", Name: "one"}); err != nil {
		t.Errorf("the view serves reads once a holder lets it: %v", err)
	}
	if _, err := f.cache.Get(t.Context(), Query{Resource: cmGVR, Namespace: "b", Name: "one"}); !errors.Is(err, ErrNotCached) {
		t.Errorf("another namespace: %v, want ErrNotCached", err)
	}
	served.Release()
	served.Release() // twice is once
	if _, err := f.cache.Get(t.Context(), Query{Resource: cmGVR, Namespace: "a", Name: "one"}); !errors.Is(err, ErrNotCached) {
		t.Errorf("released: %v", err)
	}
	h.Release()
	f.cache.Wait() // the informer stops with its last holder
}

// A read after the operator's own write waits until the cache shows that write;
// past the timeout it answers what the cache holds.
func TestReadsSeeTheOperatorsOwnWrites(t *testing.T) {
	f := newFixture(t, configMap("a", "one", "10", map[string]string{"v": "1"}))
	f.acquire(t, View{Resource: cmGVR}, true)
	ctx := t.Context()
	if _, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	written := configMap("a", "one", "20", map[string]string{"v": "2"})
	f.cache.Wrote(cmGVR, "a", "one", written.Object) // the watch has not delivered it
	got := make(chan map[string]any, 1)
	go func() {
		obj, _ := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"})
		got <- obj
	}()
	select {
	case obj := <-got:
		t.Fatalf("the read answered before the watch delivered the write: %v", metaOf(obj)["resourceVersion"])
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := f.dyn.Resource(cmGVR).Namespace("a").Update(ctx, written, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if obj := <-got; metaOf(obj)["resourceVersion"] != "20" {
		t.Errorf("read %v, want the written version", metaOf(obj)["resourceVersion"])
	}

	// A write the watch never delivers: the read waits out the timeout only.
	f.cache.Wrote(cmGVR, "a", "one", configMap("a", "one", "30", nil).Object)
	go func() {
		obj, _ := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"})
		got <- obj
	}()
	for !f.clock.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	f.clock.Step(6 * time.Second)
	if obj := <-got; metaOf(obj)["resourceVersion"] != "20" {
		t.Errorf("past the timeout, read %v, want what the cache holds", metaOf(obj)["resourceVersion"])
	}

	// A write that takes the object out of the view: the read waits for it to go.
	f.cache.Wrote(cmGVR, "a", "one", nil)
	if err := f.dyn.Resource(cmGVR).Namespace("a").Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"}); !apierrors.IsNotFound(err) {
		t.Errorf("after its own delete, the read found it: %v", err)
	}
}

// A write that takes an object out of a selected view is awaited as its absence,
// then read from the API server (the view no longer says anything of it).
func TestAWriteOutOfASelectedViewIsAwaitedAsAbsence(t *testing.T) {
	f := newFixture(t, configMap("a", "one", "10", map[string]string{"replicate": "true"}))
	h := f.acquire(t, View{Resource: cmGVR, LabelSelector: "replicate=true"}, true)
	ctx := t.Context()
	if _, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"}); err != nil {
		t.Fatal(err)
	}
	f.cache.Wrote(cmGVR, "a", "one", configMap("a", "one", "11", nil).Object)
	done := make(chan error, 1)
	go func() {
		_, err := f.cache.Get(ctx, Query{Resource: cmGVR, Namespace: "a", Name: "one"})
		done <- err
	}()
	// The fake client's watch does not select by label: the departure is delivered
	// as the API server delivers it, a DELETED event.
	if err := h.Informer().GetStore().Delete(configMap("a", "one", "10", nil)); err != nil {
		t.Fatal(err)
	}
	h.v.mu.Lock()
	e := h.v.expect["a/one"]
	h.v.mu.Unlock()
	if e != nil {
		writeWaker{h.v}.OnDelete(configMap("a", "one", "11", nil))
	}
	if err := <-done; !errors.Is(err, ErrNotCached) {
		t.Errorf("read %v, want ErrNotCached (read from the API server) once the object left the view", err)
	}
}

func ExampleUnion() {
	sel := Union([]HandlerFilter{
		{Labels: []LabelFilter{{Key: "replicate", Op: LabelEquals, Value: "true"}}},
		{Labels: []LabelFilter{{Key: "replicate", Op: LabelEquals, Value: "true"}, {Key: "tier", Op: LabelPresent}}},
	})
	fmt.Println(sel.Labels)
	// Output: replicate=true
}

func mustParse(s string) labels.Selector {
	sel, err := labels.Parse(s)
	if err != nil {
		panic(err)
	}
	return sel
}
