package processing

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

func TestHeldAfterCause(t *testing.T) {
	size := []string{"spec", "size"}
	fields := map[string][]string{"sized": size, "other": {"spec", "other"}}
	handled := map[string]any{"spec": map[string]any{"size": int64(2)}}
	one := heldValue{value: int64(1), present: true}
	for _, tc := range []struct {
		name        string
		before, out map[string]heldValue
		ran         map[string]bool
		want        map[string]heldValue
	}{
		{"passed by: what it last handled is held", nil, map[string]heldValue{"sized": one}, nil, map[string]heldValue{"sized": one}},
		{"passed by again: the first value it missed stays", map[string]heldValue{"sized": one}, map[string]heldValue{"sized": {value: int64(5), present: true}}, nil, map[string]heldValue{"sized": one}},
		{"it ran: nothing held", map[string]heldValue{"sized": one}, nil, map[string]bool{"sized": true}, map[string]heldValue{}},
		{"back at the value it last handled: nothing missed", map[string]heldValue{"sized": {value: int64(2), present: true}}, nil, nil, map[string]heldValue{}},
		{"passed by at creation: it never saw the field", nil, map[string]heldValue{"sized": {}}, nil, map[string]heldValue{"sized": {}}},
		{"a handler no longer registered", map[string]heldValue{"gone": one}, nil, nil, map[string]heldValue{}},
		{"held, neither run nor passed by (its filter still fails, its field unchanged)", map[string]heldValue{"sized": one}, nil, map[string]bool{"other": true}, map[string]heldValue{"sized": one}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := heldAfterCause(tc.before, tc.out, tc.ran, handled, fields)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("held %v, want %v", got, tc.want)
			}
		})
	}
	// Stored and read back, with the essence untouched.
	stored := withHeldBack(handled, "luaop.dev", map[string]heldValue{"sized": one, "other": {}})
	essence, held := splitHeldBack(stored, "luaop.dev")
	if !reflect.DeepEqual(essence, handled) || !reflect.DeepEqual(held, map[string]heldValue{"sized": one, "other": {}}) {
		t.Fatalf("read back %v and %v", essence, held)
	}
	if _, ok := handled["luaop.dev/held-back"]; ok {
		t.Fatalf("withHeldBack wrote into the essence it was given")
	}
}

// A field handler filtered by a label: the object leaves the filter, its field
// changes, it comes back. The handler sees the field's final value, as it does when
// the watch hides the state out of the filter (e2e TestHiddenIntermediateStates);
// before, the cause that completed out of the filter (another handler, here an
// unfiltered delete handler, made the object count) stored a diff-base with the new
// value, and the handler never ran on it.
func TestAFieldHandlerBackInItsFilterSeesWhatChangedMeanwhile(t *testing.T) {
	for _, also := range []string{"a delete handler", "an update handler of the whole object"} {
		t.Run("with "+also, func(t *testing.T) {
			h := newFakeHandlers()
			sized := changeSpec("sized", causes.Create, causes.Update)
			sized.Field = []string{"spec", "size"}
			h.add(sized, nil)
			h.match["sized"] = func(c causes.Cause) bool {
				labels, _, _ := unstructured.NestedStringMap(c.Body, "metadata", "labels")
				return labels["tier"] == "on"
			}
			if also == "a delete handler" {
				h.add(changeSpec("gone", causes.Delete), nil)
			} else {
				h.add(changeSpec("changed", causes.Update), nil)
			}
			e := startEnv(t, h, Options{})
			e.create("w1", map[string]any{"size": int64(1)})
			e.patch("w1", `{"metadata":{"labels":{"tier":"on"}}}`)
			if also == "a delete handler" {
				// The finalizer's cycle of its own comes first: a barrier it passed
				// would say nothing of the handlers' cycle after it.
				e.eventually("the finalizer added", func() bool {
					u := e.get("w1")
					return u != nil && len(u.GetFinalizers()) > 0
				})
			}
			e.settleIn(widgetsGVR, "w1")
			seen := func() []string {
				var out []string
				for _, c := range h.callsOf("sized", "w1") {
					out = append(out, fmt.Sprintf("%v->%v", c.old, c.new))
				}
				return out
			}
			if got := seen(); len(got) != 1 || got[0] != "<nil>->1" {
				t.Fatalf("the field handler saw %v once in its filter, want <nil>->1", got)
			}
			e.patch("w1", `{"metadata":{"labels":{"tier":"off"}}}`)
			e.settleIn(widgetsGVR, "w1")
			e.patch("w1", `{"spec":{"size":2}}`)
			e.settleIn(widgetsGVR, "w1")
			e.patch("w1", `{"spec":{"size":3}}`)
			e.settleIn(widgetsGVR, "w1")
			if got := seen(); len(got) != 1 {
				t.Fatalf("the field handler ran out of its filter: %v", got)
			}
			e.patch("w1", `{"metadata":{"labels":{"tier":"on"}}}`)
			e.settleIn(widgetsGVR, "w1")
			if got := seen(); len(got) != 2 || got[1] != "1->3" {
				t.Fatalf("back in its filter the field handler saw %v, want <nil>->1 then 1->3", got)
			}
			// Nothing is held any more: the next change is an ordinary one.
			if _, ok := e.annotations("w1")["luaop.dev/last-handled-configuration"]; !ok {
				t.Fatalf("no diff-base stored")
			}
			e.patch("w1", `{"spec":{"size":4}}`)
			e.settleIn(widgetsGVR, "w1")
			if got := seen(); len(got) != 3 || got[2] != "3->4" {
				t.Fatalf("the field handler saw %v, want a third run 3->4", got)
			}
			// Out of the filter and back with no change of the field meanwhile: no run.
			e.patch("w1", `{"metadata":{"labels":{"tier":"off"}}}`)
			e.settleIn(widgetsGVR, "w1")
			e.patch("w1", `{"metadata":{"labels":{"tier":"on"}}}`)
			e.settleIn(widgetsGVR, "w1")
			if got := seen(); len(got) != 3 {
				t.Fatalf("the field handler ran although its field did not change: %v", got)
			}
		})
	}
}

// A cause only for a held-back field handler whose filter no longer matches when the
// handlers are selected (a filter that changes its mind: it depends on the time, say)
// writes nothing: there is nothing to store (and a write would bring an event, and,
// with such a filter, another cause).
func TestAHeldBackCauseWithNothingToRunWritesNothing(t *testing.T) {
	h := newFakeHandlers()
	sized := changeSpec("sized", causes.Create, causes.Update)
	sized.Field = []string{"spec", "size"}
	h.add(sized, nil)
	h.add(changeSpec("gone", causes.Delete), nil)
	var mu sync.Mutex
	inFilter, once := true, false
	h.match["sized"] = func(c causes.Cause) bool {
		mu.Lock()
		defer mu.Unlock()
		if once { // in its filter for one call, out of it after
			once, inFilter = false, false
			return true
		}
		return inFilter
	}
	set := func(in, justOnce bool) {
		mu.Lock()
		defer mu.Unlock()
		inFilter, once = in, justOnce
	}
	var stores atomic.Int64 // the operator's writes of the diff-base
	e := startEnvWith(t, h, Options{}, func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if pa, ok := action.(clienttesting.PatchAction); ok && strings.Contains(string(pa.GetPatch()), "last-handled-configuration") {
				stores.Add(1)
			}
			return false, nil, nil
		})
	})
	e.create("w1", map[string]any{"size": int64(1)})
	e.eventually("the finalizer added", func() bool {
		u := e.get("w1")
		return u != nil && len(u.GetFinalizers()) > 0
	})
	e.settleIn(widgetsGVR, "w1")
	set(false, false)
	e.patch("w1", `{"spec":{"size":2}}`) // passed by: size 1 held back
	e.settleIn(widgetsGVR, "w1")
	set(false, true)
	before := stores.Load()
	// An event that changes nothing of the essence (the barrier writes status): its
	// cycle finds the held-back cause pending, then no handler to run.
	e.settleIn(widgetsGVR, "w1")
	if n := stores.Load() - before; n != 0 {
		t.Fatalf("%d writes of the diff-base for a cause that ran nothing, want none", n)
	}
	if n := len(h.callsOf("sized", "w1")); n != 1 {
		t.Fatalf("the field handler ran %d times, want once (at creation)", n)
	}
}
