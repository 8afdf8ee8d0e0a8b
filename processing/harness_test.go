package processing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	discoveryfake "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/luaop/luaop/processing/causes"
)

// The harness runs the real processing core (informers, work queue, workers,
// patches) against client-go's fake dynamic client and a fake clock, with handlers
// written in Go. The fake handlers take a "shard" mutex around every call, as the
// Lua runtime does, so lock-order problems between the core and the runtime show.

var (
	widgetsGVR    = schema.GroupVersionResource{Group: "example.luaop.dev", Version: "v1", Resource: "widgets"}
	configmapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	widgets       = causes.Resource{GroupVersionResource: widgetsGVR}
)

func fakeDiscovery() *discoveryfake.FakeDiscovery {
	return &discoveryfake.FakeDiscovery{Fake: &clienttesting.Fake{Resources: []*metav1.APIResourceList{
		{GroupVersion: "example.luaop.dev/v1", APIResources: []metav1.APIResource{
			{Name: "widgets", SingularName: "widget", Kind: "Widget", Namespaced: true, ShortNames: []string{"wd"}},
			{Name: "widgets/status", Kind: "Widget", Namespaced: true},
		}},
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "configmaps", SingularName: "configmap", Kind: "ConfigMap", Namespaced: true, ShortNames: []string{"cm"}},
		}},
	}}}
}

// handlerFunc is one Go handler; daemonFunc one Go daemon.
type (
	handlerFunc func(ctx context.Context, call causes.Call) (causes.Result, error)
	daemonFunc  func(ctx context.Context, call causes.Call) error
)

type callRecord struct {
	id, uid, name string
	reason        causes.Reason
	old, new      any
	eventType     string
	retry         int
}

// fakeHandlers implements Handlers and DaemonRunner.
type fakeHandlers struct {
	shard sync.Mutex // what a Lua shard's lock is to luabind.Runtime

	mu        sync.Mutex
	specs     []causes.Spec
	fns       map[string]handlerFunc
	daemons   map[string]daemonFunc
	match     map[string]func(causes.Cause) bool
	calls     []callRecord
	forgotten []string
	inFlight  map[string]int // by object name: handler calls running now
	overlap   []string       // objects with two handler calls at once
	// daemonsOnCaller runs a daemon on the goroutine that starts it, done called
	// before StartDaemon returns (as luabind does for a daemon that ends before it
	// first sleeps, or sleeps inside pcall); otherwise on a goroutine of its own, done
	// called from there (as luabind does for a daemon woken from a sleep).
	daemonsOnCaller bool
}

func newFakeHandlers() *fakeHandlers {
	return &fakeHandlers{fns: map[string]handlerFunc{}, daemons: map[string]daemonFunc{},
		match: map[string]func(causes.Cause) bool{}, inFlight: map[string]int{}}
}

// add registers a handler (a new Specs slice, as a reload makes).
func (h *fakeHandlers) add(spec causes.Spec, fn handlerFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if spec.Backoff == 0 {
		spec.Backoff = time.Minute
	}
	h.specs = append(append([]causes.Spec(nil), h.specs...), spec)
	if fn != nil {
		h.fns[spec.ID] = fn
	}
}

// edit changes a registered handler's spec (a new Specs slice, as a reload makes).
func (h *fakeHandlers) edit(id string, change func(*causes.Spec)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.specs = slices.Clone(h.specs)
	for i := range h.specs {
		if h.specs[i].ID == id {
			change(&h.specs[i])
		}
	}
}

func (h *fakeHandlers) addDaemon(spec causes.Spec, fn daemonFunc) {
	spec.Kind = causes.KindDaemon
	h.add(spec, nil)
	h.mu.Lock()
	h.daemons[spec.ID] = fn
	h.mu.Unlock()
}

func (h *fakeHandlers) Specs() []causes.Spec {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.specs
}

func (h *fakeHandlers) Match(ctx context.Context, spec causes.Spec, cause causes.Cause) (bool, error) {
	h.mu.Lock()
	m := h.match[spec.ID]
	h.mu.Unlock()
	if m == nil {
		return true, nil
	}
	h.shard.Lock()
	defer h.shard.Unlock()
	return m(cause), nil
}

func (h *fakeHandlers) Invoke(ctx context.Context, call causes.Call) (causes.Result, error) {
	meta, _ := call.Cause.Body["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	uid, _ := meta["uid"].(string)
	h.mu.Lock()
	fn := h.fns[call.Handler.ID]
	h.calls = append(h.calls, callRecord{id: call.Handler.ID, uid: uid, name: name, reason: call.Cause.Reason,
		old: call.Cause.Old, new: call.Cause.New, eventType: call.Cause.EventType, retry: call.Retry})
	h.inFlight[name]++
	if h.inFlight[name] > 1 {
		h.overlap = append(h.overlap, name)
	}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.inFlight[name]--
		h.mu.Unlock()
	}()
	if fn == nil {
		return causes.Result{}, nil
	}
	return fn(ctx, call)
}

func (h *fakeHandlers) Forget(uid string) {
	h.shard.Lock()
	defer h.shard.Unlock()
	h.mu.Lock()
	h.forgotten = append(h.forgotten, uid)
	h.mu.Unlock()
}

func (h *fakeHandlers) StartDaemon(ctx context.Context, call *causes.Call, done func(error)) {
	h.mu.Lock()
	fn, onCaller := h.daemons[call.Handler.ID], h.daemonsOnCaller
	h.mu.Unlock()
	if onCaller {
		done(fn(ctx, *call))
		return
	}
	go func() { done(fn(ctx, *call)) }()
}

// callsOf returns the calls of one handler (on one object, when name is not "").
func (h *fakeHandlers) callsOf(id, name string) []callRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []callRecord
	for _, c := range h.calls {
		if c.id == id && (name == "" || c.name == name) {
			out = append(out, c)
		}
	}
	return out
}

func (h *fakeHandlers) forgottenUIDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.forgotten...)
}

// env is one operator running on fakes.
type env struct {
	t     *testing.T
	dyn   *dynamicfake.FakeDynamicClient
	clock *testingclock.FakeClock
	op    *Reactor
	h     *fakeHandlers
	stop  context.CancelFunc
	done  chan error
	uids  int

	stopOnce sync.Once

	// settled: the newest resourceVersion seen by a cycle of each object (by
	// "resource/name") that did not wait for the operator's own write
	// (Reactor.cycleDone); barriers counts settleIn's writes.
	cyclesMu sync.Mutex
	settled  map[string]string
	barriers int
}

func newScheme() *runtime.Scheme { return runtime.NewScheme() }

// startEnv starts an operator on the given objects; it is stopped at the test's end.
func startEnv(t *testing.T, h *fakeHandlers, opts Options, objects ...*unstructured.Unstructured) *env {
	t.Helper()
	return startEnvWith(t, h, opts, nil, objects...)
}

// startEnvWith is startEnv with a chance to add reactors to the fake client first.
func startEnvWith(t *testing.T, h *fakeHandlers, opts Options, setup func(*dynamicfake.FakeDynamicClient), objects ...*unstructured.Unstructured) *env {
	t.Helper()
	return startEnvPruning(t, h, opts, "", setup, objects...)
}

// startEnvPruning is startEnvWith on a fake server that prunes the status field named prune
// (as a server does once a CRD's schema no longer keeps it, or always for a built-in kind)
// from the patches of widgets' /status and of configmaps; "" prunes nothing.
func startEnvPruning(t *testing.T, h *fakeHandlers, opts Options, prune string, setup func(*dynamicfake.FakeDynamicClient), objects ...*unstructured.Unstructured) *env {
	t.Helper()
	e := startEnvOn(t, h, opts, prune, setup, objects...)
	e.h = h
	return e
}

// startEnvOn is startEnvPruning with any Handlers (luabind.Runtime: the scripts'
// own); env.h is then nil.
func startEnvOn(t *testing.T, h Handlers, opts Options, prune string, setup func(*dynamicfake.FakeDynamicClient), objects ...*unstructured.Unstructured) *env {
	t.Helper()
	var objs []runtime.Object
	for _, o := range objects {
		if o.GetResourceVersion() == "" {
			o.SetResourceVersion("1") // the server always gives one
		}
		objs = append(objs, o)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(newScheme(), map[schema.GroupVersionResource]string{
		widgetsGVR: "WidgetList", configmapsGVR: "ConfigMapList", crdsGVR: "CustomResourceDefinitionList",
	}, objs...)
	stampResourceVersions(dyn, prune)
	if setup != nil {
		setup(dyn)
	}
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
	opts.Clock = clk
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testLogOutput(), nil))
	}
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	if opts.PostEvents == nil {
		f := false
		opts.PostEvents = &f
	}
	op, err := NewWithClients(Clients{Dynamic: dyn, Discovery: fakeDiscovery()}, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	e := &env{t: t, dyn: dyn, clock: clk, op: op, stop: cancel, done: make(chan error, 1), uids: 1000,
		settled: map[string]string{}}
	op.cycleDone = e.cycleDone
	go func() { e.done <- op.Start(ctx) }()
	t.Cleanup(e.shutdown)
	return e
}

// shutdown stops the operator and fails the test when it does not stop in time
// (a deadlock shows here instead of hanging the suite).
func (e *env) shutdown() { e.stopOnce.Do(e.stopAndWait) }

func (e *env) stopAndWait() {
	e.stop()
	select {
	case err := <-e.done:
		if err != nil {
			e.t.Errorf("Start returned %v", err)
		}
	case <-time.After(20 * time.Second):
		e.t.Errorf("the operator did not stop within 20 s: a deadlock or a leaked wait")
	}
}

// patchesOf is how many patches of resource the fake API server received so far.
func (e *env) patchesOf(resource schema.GroupVersionResource) int {
	n := 0
	for _, a := range e.dyn.Actions() {
		if a.GetVerb() == "patch" && a.GetResource() == resource {
			n++
		}
	}
	return n
}

// widget builds a Widget object.
func widgetObject(name, uid string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.luaop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name, "namespace": "default", "uid": uid},
		"spec":     spec,
	}}
	return u
}

func (e *env) create(name string, spec map[string]any) string {
	e.t.Helper()
	e.uids++
	uid := fmt.Sprintf("uid-%s-%d", name, e.uids)
	_, err := e.dyn.Resource(widgetsGVR).Namespace("default").Create(e.t.Context(), widgetObject(name, uid, spec), metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("creating %s: %v", name, err)
	}
	return uid
}

func (e *env) get(name string) *unstructured.Unstructured {
	e.t.Helper()
	u, err := e.dyn.Resource(widgetsGVR).Namespace("default").Get(e.t.Context(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return u
}

func (e *env) delete(name string) {
	e.t.Helper()
	if err := e.dyn.Resource(widgetsGVR).Namespace("default").Delete(e.t.Context(), name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("deleting %s: %v", name, err)
	}
}

func (e *env) patch(name string, patch string) {
	e.t.Helper()
	_, err := e.dyn.Resource(widgetsGVR).Namespace("default").Patch(e.t.Context(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		e.t.Fatalf("patching %s: %v", name, err)
	}
}

// markDeleting simulates `kubectl delete` of an object with finalizers: the server
// sets deletionTimestamp and keeps the object until the finalizers are gone.
func (e *env) markDeleting(name string) {
	e.patch(name, `{"metadata":{"deletionTimestamp":"2026-11-30T12:00:00Z"}}`)
}

// eventually waits (in real time: informers and workers run for real) for cond.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("timed out waiting for: %s", what)
}

func (e *env) cycleDone(key objectKey, seen string, waitingForOwnWrite bool) {
	if waitingForOwnWrite {
		return
	}
	e.cyclesMu.Lock()
	defer e.cyclesMu.Unlock()
	k := key.resource.Resource + "/" + key.name
	if old := e.settled[k]; old == "" || versionNewer(seen, old) {
		e.settled[k] = seen
	}
}

// settleIn is a barrier for one object: it writes a change no handler sees (status
// is outside the essence) and waits for a cycle of the object that has seen it and
// does not wait for the operator's own write. The watch delivers an object's
// events in order, and a cycle handles everything delivered before it, so every
// cause the test's earlier actions gave the object has been handled by then, or
// deferred to a later time of the fake clock (retries, timers: a cycle runs the
// ones that are due). Daemons run outside cycles: the barrier says nothing about them.
func (e *env) settleIn(gvr schema.GroupVersionResource, name string) {
	e.t.Helper()
	e.barriers++
	u, err := e.dyn.Resource(gvr).Namespace("default").Patch(e.t.Context(), name, types.MergePatchType,
		fmt.Appendf(nil, `{"status":{"testBarrier":%d}}`, e.barriers), metav1.PatchOptions{})
	if err != nil {
		e.t.Fatalf("the barrier on %s: %v", name, err)
	}
	rv := u.GetResourceVersion()
	e.eventually(fmt.Sprintf("a cycle of %s past the barrier (resourceVersion %s)", name, rv), func() bool {
		e.cyclesMu.Lock()
		defer e.cyclesMu.Unlock()
		seen := e.settled[gvr.Resource+"/"+name]
		return seen != "" && !versionOlder(seen, rv)
	})
}

// stays checks, after a barrier on the widget name (settleIn), that cond is false:
// what the test's earlier actions could cause on that object has happened by then.
func (e *env) stays(name, what string, cond func() bool) {
	e.t.Helper()
	e.staysIn(widgetsGVR, name, what, cond)
}

// staysIn is stays for an object of any resource the harness serves.
func (e *env) staysIn(gvr schema.GroupVersionResource, name, what string, cond func() bool) {
	e.t.Helper()
	e.settleIn(gvr, name)
	if cond() {
		e.t.Fatalf("unexpectedly: %s", what)
	}
}

// never checks that cond stays false for a while (300 ms of real time). Only for
// what no barrier covers (each use says why): prefer stays.
func (e *env) never(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if cond() {
			e.t.Fatalf("unexpectedly: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *env) annotations(name string) map[string]string {
	if u := e.get(name); u != nil {
		return u.GetAnnotations()
	}
	return nil
}

func changeSpec(id string, reasons ...causes.Reason) causes.Spec {
	return causes.Spec{ID: id, Kind: causes.KindChange, Resource: widgets, Reasons: reasons}
}

var errBoom = errors.New("boom")

// uidPrecondition refuses a patch that would change metadata.uid, as the API server
// does (metadata.uid is immutable).
func uidPrecondition(old runtime.Object, patch []byte) error {
	var p struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &p); err != nil || p.Metadata.UID == "" {
		return err
	}
	u, ok := old.(*unstructured.Unstructured)
	if ok && string(u.GetUID()) != p.Metadata.UID {
		return apierrors.NewConflict(schema.GroupResource{Group: u.GroupVersionKind().Group, Resource: "widgets"}, u.GetName(),
			fmt.Errorf("Precondition failed: UID in precondition: %s, UID in object meta: %s", p.Metadata.UID, u.GetUID()))
	}
	return nil
}

// stampResourceVersions makes the fake client behave like the API server in one
// respect the core relies on: every write gives the object a new, increasing
// resourceVersion, which the watch then delivers (client-go's tracker keeps its
// versions aside and never writes them into objects).
// prune, when it names a field of status, is dropped from every /status write, as a
// server whose CRD schema does not keep it would.
func stampResourceVersions(dyn *dynamicfake.FakeDynamicClient, prune string) {
	var mu sync.Mutex
	var rv int64 = 100
	next := func() string { rv++; return fmt.Sprint(rv) }
	tracker := dyn.Tracker()
	dyn.PrependReactor("*", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a := action.(type) {
		case clienttesting.CreateAction: // UpdateAction has the same method set: both land here
			if u, ok := a.GetObject().(*unstructured.Unstructured); ok {
				u.SetResourceVersion(next())
			}
		case clienttesting.PatchAction:
			if a.GetPatchType() != types.MergePatchType && a.GetPatchType() != types.JSONPatchType {
				return false, nil, nil
			}
			old, err := tracker.Get(a.GetResource(), a.GetNamespace(), a.GetName())
			if err != nil {
				return true, nil, err
			}
			if a.GetPatchType() == types.MergePatchType {
				if err := uidPrecondition(old, a.GetPatch()); err != nil {
					return true, nil, err
				}
			}
			oldJSON, err := json.Marshal(old)
			if err != nil {
				return true, nil, err
			}
			var merged []byte
			if a.GetPatchType() == types.JSONPatchType {
				ops, err := jsonpatch.DecodePatch(a.GetPatch())
				if err != nil {
					return true, nil, err
				}
				if merged, err = ops.Apply(oldJSON); err != nil {
					// A failed "test" operation: the server answers 422.
					return true, nil, apierrors.NewInvalid(schema.GroupKind{Kind: "Widget"}, a.GetName(), nil)
				}
			} else if merged, err = jsonpatch.MergePatch(oldJSON, a.GetPatch()); err != nil {
				return true, nil, err
			}
			u := &unstructured.Unstructured{}
			if err := json.Unmarshal(merged, &u.Object); err != nil {
				return true, nil, err
			}
			// ConfigMaps stand for a kind whose status is no subresource: their patches
			// carry status, and the server drops what it does not keep.
			if prune != "" && (a.GetSubresource() == "status" || a.GetResource() == configmapsGVR) {
				unstructured.RemoveNestedField(u.Object, "status", prune)
			}
			u.SetResourceVersion(next())
			if err := tracker.Update(a.GetResource(), u, a.GetNamespace()); err != nil {
				return true, nil, err
			}
			return true, u.DeepCopy(), nil
		}
		return false, nil, nil
	})
}

// holdBackWatch makes the fake watch of widgets skip the MODIFIED events for which
// hold returns true, as a watch lagging behind the operator's own writes would.
func holdBackWatch(hold func(*unstructured.Unstructured) bool) func(*dynamicfake.FakeDynamicClient) {
	return func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependWatchReactor("widgets", func(action clienttesting.Action) (bool, watch.Interface, error) {
			var opts metav1.ListOptions // as the fake's own reactor: the tracker resumes from the list
			if wa, ok := action.(clienttesting.WatchActionImpl); ok {
				opts = wa.ListOptions
			}
			w, err := dyn.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
			if err != nil {
				return true, nil, err
			}
			return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				u, ok := ev.Object.(*unstructured.Unstructured)
				return ev, !(ok && ev.Type == watch.Modified && hold(u))
			}), nil
		})
	}
}

// testLogOutput: the core's log is discarded unless LUAOP_TEST_LOG=1.
func testLogOutput() io.Writer {
	if os.Getenv("LUAOP_TEST_LOG") == "1" {
		return os.Stderr
	}
	return io.Discard
}
