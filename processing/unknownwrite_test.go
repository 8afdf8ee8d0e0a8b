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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

// A write the server applied but whose answer was lost (the connection broke: the
// API server was killed right after applying it) must not make the operator run
// again the handler whose success it stored: the next cycle reads the object from
// the server instead of trusting its cached copy (found by e2e
// TestControlPlaneRestarts). The watch is held back meanwhile, as a watch broken by
// the same restart would be.
func TestAWriteWithoutAnswerDoesNotRunItsHandlerAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fail     error
		wantRuns int
	}{
		{name: "connection broken after the server applied it", fail: io.ErrUnexpectedEOF, wantRuns: 1},
		{name: "the server timed out but applied it", fail: apierrors.NewTimeoutError("the write took too long", 1), wantRuns: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var holding, failed atomic.Bool
			holding.Store(true)
			h := newFakeHandlers()
			h.add(changeSpec("create_fn", causes.Create), nil)
			h.add(changeSpec("update_fn", causes.Update), nil)
			handledWrite := func(patch []byte) bool { return strings.Contains(string(patch), "last-handled-configuration") }
			e := startEnvWith(t, h, Options{ConsistencyTimeout: 5 * time.Second}, func(dyn *dynamicfake.FakeDynamicClient) {
				holdBackWatch(func(u *unstructured.Unstructured) bool {
					_, handled := u.GetAnnotations()["luaop.dev/last-handled-configuration"]
					return holding.Load() && handled
				})(dyn)
				// The first write storing the creation's success is applied (by the
				// reactors after this one), then answered with the broken connection.
				dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
					pa, ok := action.(clienttesting.PatchAction)
					if !ok || !handledWrite(pa.GetPatch()) || !failed.CompareAndSwap(false, true) {
						return false, nil, nil
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
			e.eventually("the creation's success stored by the write whose answer was lost", func() bool {
				_, stored := e.annotations("w1")["luaop.dev/last-handled-configuration"]
				return stored && failed.Load()
			})
			// The retry comes after the per-object backoff; the watch never delivers the
			// write, so time moves past the consistency timeout at every look.
			e.never("the create handler running again", func() bool {
				e.clock.Step(time.Second)
				return len(h.callsOf("create_fn", "w1")) > tc.wantRuns
			})
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
