package processing

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

// finishedCounter counts finished cycles through the Observer.
type finishedCounter struct {
	cycleCounter
	finished atomic.Int64
}

func (c *finishedCounter) ReconcileFinished(string, string, time.Duration) { c.finished.Add(1) }

// A write the server applied but whose answer was lost (the connection broke: the
// API server was killed right after applying it; a timeout) must not make the
// operator run again the handler whose success it stored: the next cycles read the
// object from the server instead of trusting the cached copy, until they see the
// write or the time it could still be applied has passed (found by e2e
// TestControlPlaneRestarts). The watch is held back meanwhile, as a watch broken by
// the same restart would be. A refused connection is a write that was not applied:
// the handler runs again, as its success was never stored.
func TestAWriteWithoutAnswerDoesNotRunItsHandlerAgain(t *testing.T) {
	for _, tc := range []struct {
		name       string
		fail       error
		applyLater bool // the server applies the write after the first read (a timed-out request running on)
		wantReads  bool
		wantRuns   int
	}{
		{name: "connection broken after the server applied it", fail: io.ErrUnexpectedEOF, wantReads: true, wantRuns: 1},
		{name: "the server timed out but applied it", fail: apierrors.NewTimeoutError("the write took too long", 1), wantReads: true, wantRuns: 1},
		{name: "the server timed out and applied it later", fail: apierrors.NewTimeoutError("the write took too long", 1), applyLater: true, wantReads: true, wantRuns: 1},
		{name: "connection refused: not applied", fail: fmt.Errorf("dial: %w", syscall.ECONNREFUSED), wantRuns: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var holding, failed atomic.Bool
			counter := &finishedCounter{}
			var reads, finishedAtFirstRead atomic.Int64
			var held clienttesting.PatchAction
			holding.Store(true)
			h := newFakeHandlers()
			h.add(changeSpec("create_fn", causes.Create), nil)
			h.add(changeSpec("update_fn", causes.Update), nil)
			handledWrite := func(patch []byte) bool { return strings.Contains(string(patch), "last-handled-configuration") }
			e := startEnvWith(t, h, Options{ConsistencyTimeout: 5 * time.Second, Observer: counter}, func(dyn *dynamicfake.FakeDynamicClient) {
				holdBackWatch(func(u *unstructured.Unstructured) bool {
					_, handled := u.GetAnnotations()["luaop.dev/last-handled-configuration"]
					return holding.Load() && handled
				})(dyn)
				dyn.PrependReactor("get", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
					if reads.Add(1) == 1 {
						finishedAtFirstRead.Store(counter.finished.Load())
					}
					return false, nil, nil
				})
				// The first write storing the creation's success is applied (by the
				// reactors after this one) unless it is refused or applied later, then
				// answered with the failure.
				dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
					pa, ok := action.(clienttesting.PatchAction)
					if !ok || !handledWrite(pa.GetPatch()) || !failed.CompareAndSwap(false, true) {
						return false, nil, nil
					}
					if tc.applyLater {
						held = pa
						return true, nil, tc.fail
					}
					if errors.Is(tc.fail, syscall.ECONNREFUSED) {
						return true, nil, tc.fail
					}
					for _, r := range dyn.ReactionChain[1:] {
						if !r.Handles(action) {
							continue
						}
						if handled, _, err := r.React(action); handled {
							if err != nil {
								t.Errorf("applying the write before losing its answer: %v", err)
							}
							break
						}
					}
					return true, nil, tc.fail
				})
			})
			e.create("w1", map[string]any{"size": int64(1)})
			e.eventually("the write storing the creation's success failed", func() bool { return failed.Load() })
			if !tc.wantReads {
				// Not applied: the retry (after the per-object backoff) runs the handler again.
				e.eventually("the create handler run again", func() bool {
					e.clock.Step(time.Second)
					return len(h.callsOf("create_fn", "w1")) == tc.wantRuns
				})
				if n := reads.Load(); n != 0 {
					t.Errorf("%d reads of the object after a refused write, want none", n)
				}
				return
			}
			e.eventually("the object read from the server after the failed write", func() bool {
				e.clock.Step(time.Second) // the per-object backoff
				return reads.Load() > 0
			})
			if tc.applyLater {
				if _, err := e.dyn.Resource(widgetsGVR).Namespace("default").Patch(t.Context(), "w1", held.GetPatchType(), held.GetPatch(), metav1.PatchOptions{}); err != nil {
					t.Fatalf("applying the write late: %v", err)
				}
			}
			// The cycle that read the object has finished, and another one ran with the
			// clock past both the time the write could still land and the consistency
			// timeout: the handler would have run in one of them. The watch never
			// delivers the write, so every cycle of w1 is one of the reads or of the
			// waits (no barrier write gets through).
			cycles := int64(2) // the read finds the write, the wait for the watch times out
			if tc.applyLater {
				cycles = 3 // the first read finds nothing newer and waits for it to land
			}
			start := e.clock.Now()
			e.eventually("the cycles from the first read, the last past every wait", func() bool {
				e.clock.Step(time.Second)
				return counter.finished.Load() >= finishedAtFirstRead.Load()+cycles && e.clock.Now().Sub(start) > 12*time.Second
			})
			if n := len(h.callsOf("create_fn", "w1")); n != tc.wantRuns {
				t.Fatalf("the create handler ran %d times, want %d", n, tc.wantRuns)
			}
			if n := len(h.callsOf("update_fn", "w1")); n != 0 {
				t.Fatalf("the update handler ran %d times: the operator's own write was taken for a change", n)
			}
			// The watch catches up; a real change is handled once, as an update.
			holding.Store(false)
			e.patch("w1", `{"spec":{"size":2}}`)
			e.eventually("the update handled", func() bool { return len(h.callsOf("update_fn", "w1")) == 1 })
			if n := len(h.callsOf("create_fn", "w1")); n != tc.wantRuns {
				t.Fatalf("the create handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

func TestWriteOutcomeUnknown(t *testing.T) {
	gr := schema.GroupResource{Group: "examples.luaop.dev", Resource: "widgets"}
	for _, tc := range []struct {
		err     error
		unknown bool
	}{
		{io.ErrUnexpectedEOF, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), false},
		{apierrors.NewServiceUnavailable("shutting down"), true},
		{fmt.Errorf("patching: %w", syscall.ECONNRESET), true},
		{apierrors.NewTimeoutError("slow", 1), true},
		{apierrors.NewServerTimeout(gr, "patch", 1), true},
		{apierrors.NewInternalError(errors.New("etcd")), true},
		{apierrors.NewConflict(gr, "w1", errors.New("changed")), false},
		{apierrors.NewInvalid(schema.GroupKind{Kind: "Widget"}, "w1", nil), false},
		{apierrors.NewForbidden(gr, "w1", errors.New("rbac")), false},
		{apierrors.NewNotFound(gr, "w1"), false},
	} {
		if got := writeOutcomeUnknown(tc.err); got != tc.unknown {
			t.Errorf("writeOutcomeUnknown(%v) = %v, want %v", tc.err, got, tc.unknown)
		}
	}
}
