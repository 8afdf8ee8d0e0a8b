package processing

import (
	"context"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

func TestFreshnessFloorStale(t *testing.T) {
	key := objectKey{resource: widgets, namespace: "default", name: "w1"}
	other := key
	other.name = "w2"
	body := func(uid, rv string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetUID(types.UID(uid))
		u.SetResourceVersion(rv)
		return u
	}
	floor := func() *freshnessFloor {
		return &freshnessFloor{versions: map[string]string{"default": "50"}, objects: map[objectKey]floorEntry{key: {uid: "u1", version: "40"}}}
	}
	for _, tc := range []struct {
		name  string
		key   objectKey
		body  *unstructured.Unstructured
		stale bool
	}{
		{"the version the read saw", key, body("u1", "40"), false},
		{"newer than the read", key, body("u1", "60"), false},
		{"newer than its entry, older than the read", key, body("u1", "45"), false},
		{"older than its entry", key, body("u1", "30"), true},
		{"an incarnation replaced by the time of the read", key, body("u0", "20"), true},
		{"gone by the time of the read", other, body("u2", "30"), true},
		{"created after the read", other, body("u2", "51"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := floor()
			if got := f.stale(tc.key, tc.body); got != tc.stale {
				t.Fatalf("stale = %v, want %v", got, tc.stale)
			}
			// A fresh body takes its key past the floor: the entry goes.
			if _, kept := f.objects[key]; !tc.stale && tc.key == key && kept {
				t.Errorf("the entry of a key whose body is fresh is kept")
			}
		})
	}
	var none *freshnessFloor
	if none.stale(key, body("u1", "1")) {
		t.Errorf("without a floor (not loadable) a body is stale")
	}
	f := &freshnessFloor{versions: map[string]string{"": "50"}, objects: map[objectKey]floorEntry{key: {uid: "u1", version: "40"}}}
	if !f.stale(key, body("u1", "30")) {
		t.Errorf("a cluster-wide read does not cover a namespaced key")
	}
}

// The informers' first list comes from a state older than what the operator (or
// the one before it) handled: the object's creation is handled on the server, the
// list shows it unhandled. The operator reads the object from the server before
// running anything, waits for the watch to bring that version, and past the
// consistency timeout handles what it read: the create handler never runs again.
// When the watch brings a newer version while the object is read, the cycle stops
// and the next one takes it.
func TestAStaleFirstListRunsNothingAgain(t *testing.T) {
	for _, watchCatchesUp := range []bool{false, true} {
		name := "the watch stays behind"
		if watchCatchesUp {
			name = "the watch catches up during the read"
		}
		t.Run(name, func(t *testing.T) {
			h := newFakeHandlers()
			h.add(changeSpec("create_fn", causes.Create), nil)
			handled := widgetObject("w1", "uid-1", map[string]any{"size": int64(1)})
			encoded, err := state.EncodeEssence(state.Essence(handled.Object, "luaop.dev"))
			if err != nil {
				t.Fatal(err)
			}
			handled.SetAnnotations(map[string]string{"luaop.dev/last-handled-configuration": encoded})
			handled.SetResourceVersion("60")
			stale := widgetObject("w1", "uid-1", map[string]any{"size": int64(1)})
			stale.SetResourceVersion("30")
			listOf := func(rv string, items ...*unstructured.Unstructured) *unstructured.UnstructuredList {
				l := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "example.luaop.dev/v1", "kind": "WidgetList",
					"metadata": map[string]any{"resourceVersion": rv}}}
				for _, it := range items {
					l.Items = append(l.Items, *it.DeepCopy())
				}
				return l
			}
			var lists, gets atomic.Int64
			var started atomic.Pointer[env]
			// The informer's watch, once started: an update made through the tracker
			// before it would never reach the watch (the fake tracker replays nothing).
			var watching atomic.Bool
			opts := Options{ConsistencyTimeout: 2 * time.Second, ProgressStorage: StorageAnnotations, DiffBaseStorage: StorageAnnotations}
			e := startEnvWith(t, h, opts, func(dyn *dynamicfake.FakeDynamicClient) {
				dyn.PrependReactor("list", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
					if lists.Add(1) == 1 {
						return true, listOf("70", handled), nil // the consistent read
					}
					return true, listOf("40", stale), nil // the informer's: older
				})
				dyn.PrependWatchReactor("widgets", func(clienttesting.Action) (bool, watch.Interface, error) {
					watching.Store(true) // the default reaction registers the watcher, under the same lock
					return false, nil, nil
				})
				dyn.PrependReactor("get", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
					if watchCatchesUp && gets.Load() == 0 && !watching.Load() {
						// The cycle read the object before the informer watched: this read
						// fails (a passing error, tried again) so that the read the test is
						// about happens with the watch there to catch up.
						return true, nil, apierrors.NewTooManyRequests("the test's watch is not there yet", 1)
					}
					if gets.Add(1) == 1 && watchCatchesUp {
						// A newer version comes through the watch before the read answers.
						// (Through the tracker: the fake client's lock is held here.)
						obj, err := dyn.Tracker().Get(widgetsGVR, "default", "w1")
						if err != nil {
							t.Errorf("reading w1: %v", err)
							return false, nil, nil
						}
						touched := obj.(*unstructured.Unstructured).DeepCopy()
						touched.SetLabels(map[string]string{"touched": "yes"})
						touched.SetResourceVersion("61")
						if err := dyn.Tracker().Update(widgetsGVR, touched, "default"); err != nil {
							t.Errorf("touching w1: %v", err)
						}
						deadline := time.Now().Add(10 * time.Second)
						for time.Now().Before(deadline) {
							e := started.Load()
							if e == nil {
								time.Sleep(time.Millisecond)
								continue
							}
							st := e.op.objects.get(objectKey{resource: widgets, namespace: "default", name: "w1"})
							st.inbox.mu.Lock()
							seen := st.inbox.lastSeenVersion
							st.inbox.mu.Unlock()
							if versionNewer(seen, "60") {
								break
							}
							time.Sleep(time.Millisecond)
						}
					}
					return false, nil, nil
				})
			}, handled)
			started.Store(e)
			e.eventually("the object read from the server", func() bool {
				if gets.Load() == 0 {
					e.clock.Step(100 * time.Millisecond) // past the backoff of a refused read
				}
				return gets.Load() > 0
			})
			start := e.clock.Now()
			e.eventually("the cycles past the consistency timeout", func() bool {
				e.clock.Step(500 * time.Millisecond)
				return e.clock.Now().Sub(start) > 5*time.Second && e.op.Synced()
			})
			e.never("the create handler runs again", func() bool { return len(h.callsOf("create_fn", "w1")) > 0 })
			if lists.Load() < 2 {
				t.Fatalf("%d lists, want the consistent read and the informer's", lists.Load())
			}
		})
	}
}

// The write that removes the finalizer of an object in deletion is applied (the
// object goes) but its answer is lost, and the watch is late with the deletion: the
// next cycle reads the object from the server, finds it gone, and runs nothing on
// the copy it holds: the delete handler does not run again. It did before (found by
// the e2e harness's reasoning over TestCrashBeforeAndAfterEveryCall's finalizer
// removal): a finalizer patch without answer was not taken for a write that may
// have been applied, and a read's "not found" let the cycle go on with the cached body,
// still in deletion with the finalizer.
func TestAnUnansweredWriteOfAGoneObjectRunsNothingAgain(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("delete_fn", causes.Delete), nil)
	var holding, lost atomic.Bool
	var gets atomic.Int64
	e := startEnvWith(t, h, Options{ConsistencyTimeout: 2 * time.Second}, func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependWatchReactor("widgets", func(action clienttesting.Action) (bool, watch.Interface, error) {
			var opts metav1.ListOptions
			if wa, ok := action.(clienttesting.WatchActionImpl); ok {
				opts = wa.ListOptions
			}
			w, err := dyn.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
			if err != nil {
				return true, nil, err
			}
			// The server deletes an object in deletion as its last finalizer goes,
			// in the same write: one DELETED event, which is late.
			return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
				return ev, !lost.Load()
			}), nil
		})
		dyn.PrependReactor("get", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
			if lost.Load() {
				gets.Add(1)
			}
			return false, nil, nil
		})
		dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
			pa, ok := action.(clienttesting.PatchAction)
			if !ok || pa.GetPatchType() != types.JSONPatchType || !strings.Contains(string(pa.GetPatch()), "/metadata/finalizers") || !holding.Load() ||
				!lost.CompareAndSwap(false, true) {
				return false, nil, nil
			}
			for _, r := range dyn.ReactionChain[1:] {
				if !r.Handles(action) {
					continue
				}
				if handled, _, err := r.React(action); handled {
					if err != nil {
						t.Errorf("applying the finalizer's removal: %v", err)
					}
					break
				}
			}
			// Its last finalizer gone, the server deletes the object.
			if err := dyn.Tracker().Delete(widgetsGVR, "default", "w1"); err != nil {
				t.Errorf("deleting w1: %v", err)
			}
			return true, nil, io.ErrUnexpectedEOF
		})
	})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the finalizer added", func() bool {
		u := e.get("w1")
		return u != nil && len(u.GetFinalizers()) > 0
	})
	holding.Store(true)
	e.markDeleting("w1")
	e.eventually("the finalizer's removal applied, its answer lost", func() bool { return lost.Load() })
	e.eventually("the object read from the server after the lost answer", func() bool {
		e.clock.Step(500 * time.Millisecond) // the per-object backoff after the failed write
		return gets.Load() > 0
	})
	start := e.clock.Now()
	e.eventually("the clock past the backoffs and the consistency timeout", func() bool {
		e.clock.Step(500 * time.Millisecond)
		return e.clock.Now().Sub(start) > 10*time.Second
	})
	e.never("the delete handler runs again", func() bool { return len(h.callsOf("delete_fn", "w1")) > 1 })
	if n := len(h.callsOf("delete_fn", "w1")); n != 1 {
		t.Fatalf("the delete handler ran %d times, want 1", n)
	}
}

// A cycle writes the object (a handler's annotation) and then its /status, which the
// server applies and whose answer is lost; the watch delivers the /status write while
// the next cycle reads the object from the server. That cycle must not go on with the
// body it took at its start (older than what it read, and than what the watch has
// now): it ran the create handler again (found by the exhaustive crash harness,
// e2e TestCrashBeforeAndAfterEveryCall, "lose the answer to records purge"): the wait
// for the earlier write's version, which the watch had passed, hid that the read's
// version was delivered already.
func TestAnAnswerLostAfterAnotherWriteRunsNothingAgain(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("create_fn", causes.Create), func(_ context.Context, call causes.Call) (causes.Result, error) {
		call.Patch.SetAnnotation("test/stamp", ptrString("yes")) // a write of the object before the /status one
		return causes.Result{Value: "done"}, nil
	})
	var lost atomic.Bool
	var appliedRV atomic.Value
	var started atomic.Pointer[env]
	opts := Options{ConsistencyTimeout: 2 * time.Second, ProgressStorage: StorageStatus, DiffBaseStorage: StorageStatus}
	e := startEnvWith(t, h, opts, func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
			pa, ok := action.(clienttesting.PatchAction)
			if !ok || pa.GetSubresource() != "status" || !strings.Contains(string(pa.GetPatch()), "last-handled-configuration") ||
				!lost.CompareAndSwap(false, true) {
				return false, nil, nil
			}
			for _, r := range dyn.ReactionChain[1:] {
				if !r.Handles(action) {
					continue
				}
				if handled, obj, err := r.React(action); handled {
					if err != nil {
						t.Errorf("applying the /status write: %v", err)
					} else if u, ok := obj.(*unstructured.Unstructured); ok {
						appliedRV.Store(u.GetResourceVersion())
					}
					break
				}
			}
			return true, nil, io.ErrUnexpectedEOF
		})
		dyn.PrependReactor("get", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
			rv, _ := appliedRV.Load().(string)
			if rv == "" {
				return false, nil, nil
			}
			// The watch delivers the applied write before the read answers.
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if e := started.Load(); e != nil {
					if st := e.op.objects.get(objectKey{resource: widgets, namespace: "default", name: "w1"}); st != nil {
						st.inbox.mu.Lock()
						seen := st.inbox.lastSeenVersion
						st.inbox.mu.Unlock()
						if !versionOlder(seen, rv) {
							break
						}
					}
				}
				time.Sleep(time.Millisecond)
			}
			return false, nil, nil
		})
	})
	started.Store(e)
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the /status write applied, its answer lost", func() bool { return lost.Load() })
	start := e.clock.Now()
	e.eventually("the clock past the backoff and the consistency timeout", func() bool {
		e.clock.Step(250 * time.Millisecond)
		return e.clock.Now().Sub(start) > 10*time.Second
	})
	e.settleIn(widgetsGVR, "w1")
	if n := len(h.callsOf("create_fn", "w1")); n != 1 {
		t.Fatalf("the create handler ran %d times, want 1", n)
	}
}

func ptrString(s string) *string { return &s }
