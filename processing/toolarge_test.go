package processing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// eventLog is an EventRecorder that keeps "type reason message" of every Event.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) Event(_ runtime.Object, eventType, reason, message string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, eventType+" "+reason+" "+message)
}

func (l *eventLog) Eventf(o runtime.Object, eventType, reason, format string, args ...any) {
	l.Event(o, eventType, reason, fmt.Sprintf(format, args...))
}

func (l *eventLog) AnnotatedEventf(o runtime.Object, _ map[string]string, eventType, reason, format string, args ...any) {
	l.Event(o, eventType, reason, fmt.Sprintf(format, args...))
}

// with returns the events whose reason is reason and whose message mentions text.
func (l *eventLog) with(reason, text string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		if strings.Contains(e, " "+reason+" ") && strings.Contains(e, text) {
			out = append(out, e)
		}
	}
	return out
}

// refuseObjectsOver makes the fake server refuse, with refusal, every write of a
// widget after which the object would be over limit bytes as JSON (what etcd does
// past its request limit, and the API server past its own).
func refuseObjectsOver(limit int, refusal error) func(*dynamicfake.FakeDynamicClient) {
	return func(dyn *dynamicfake.FakeDynamicClient) {
		dyn.PrependReactor("patch", "widgets", func(action clienttesting.Action) (bool, runtime.Object, error) {
			a := action.(clienttesting.PatchAction)
			old, err := dyn.Tracker().Get(a.GetResource(), a.GetNamespace(), a.GetName())
			if err != nil {
				return false, nil, nil
			}
			raw, _ := json.Marshal(old)
			if len(raw)+len(a.GetPatch()) > limit {
				return true, nil, refusal
			}
			return false, nil, nil
		})
	}
}

// Issue 34, item 8: a handler whose result (or ctx.patch) is under the limit of one
// write, but makes the object larger than the server stores, fails for good at once
// with the server's reason: it runs once, its failure is in its progress record
// (written without what it wrote), a HandlerFailed Event names the reason and no
// HandlerSucceeded is posted for it; the other handlers go on. Both answers the API
// server gives: 413 (its own limit) and etcd's "request is too large" as a 500.
func TestWriteTooLargeFailsTheHandlerForGood(t *testing.T) {
	const limit = 100 << 10
	big := strings.Repeat("x", 60<<10)
	refusals := map[string]error{
		"413":      apierrors.NewRequestEntityTooLargeError("limit is 3145728"),
		"etcd 500": apierrors.NewInternalError(errors.New("etcdserver: request is too large")),
	}
	for name, refusal := range refusals {
		for _, viaPatch := range []bool{false, true} {
			for _, mode := range []StorageMode{StorageAnnotations, StorageStatus} {
				t.Run(fmt.Sprintf("%s/patch=%v/%s", name, viaPatch, mode), func(t *testing.T) {
					h := newFakeHandlers()
					write := func(call causes.Call) (causes.Result, error) {
						if viaPatch {
							call.Patch.Set([]string{"spec", "data-" + call.Handler.ID}, big)
							return causes.Result{}, nil
						}
						return causes.Result{Value: big}, nil
					}
					h.add(changeSpec("first", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) { return write(call) })
					h.add(changeSpec("second", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) { return write(call) })
					// A third one keeps the cause open, so that the records stay on the object.
					h.add(changeSpec("third", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
						return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Hour}
					})
					events := &eventLog{}
					post := true
					e := startEnvWith(t, h, Options{ProgressStorage: mode, DiffBaseStorage: mode, PostEvents: &post, Recorder: events},
						refuseObjectsOver(limit, refusal))
					e.create("w", map[string]any{"size": int64(1)})
					progress := state.NewSmartProgress(state.NewAnnotationsProgress("luaop.dev"), state.NewStatusProgress("luaop_dev"))
					e.eventually("the third handler ran", func() bool { return len(h.callsOf("third", "w")) == 1 })
					e.settleIn(widgetsGVR, "w")
					// Past every backoff: nothing but "third" is due again.
					e.clock.Step(2 * time.Minute)
					e.settleIn(widgetsGVR, "w")
					if n := len(h.callsOf("second", "w")); n != 1 {
						t.Errorf("the refused handler ran %d times, want 1", n)
					}
					if n := len(h.callsOf("first", "w")); n != 1 {
						t.Errorf("the first handler ran %d times, want 1", n)
					}
					obj := e.get("w").Object
					rec, found := progress.Fetch(obj, "second")
					if !found || !rec.Failure || rec.Success || !strings.Contains(strings.ToLower(rec.Message), "too large") {
						t.Errorf("the refused handler's record = %+v (found %v): want a failure with the server's reason", rec, found)
					}
					if first, _ := progress.Fetch(obj, "first"); !first.Success {
						t.Errorf("the first handler's record = %+v: want its success", first)
					}
					raw, _ := json.Marshal(obj)
					if strings.Count(string(raw), big) != 1 {
						t.Errorf("the object holds what the handlers wrote %d times, want once (the first's)", strings.Count(string(raw), big))
					}
					if got := events.with("HandlerFailed", "second"); len(got) != 1 || !strings.Contains(got[0], "too large") {
						t.Errorf("HandlerFailed events of the refused handler: %q, want one with the server's reason", got)
					}
					if got := events.with("HandlerSucceeded", "second"); len(got) != 0 {
						t.Errorf("HandlerSucceeded posted for the refused run: %q", got)
					}
					if got := events.with("HandlerSucceeded", "first"); len(got) != 1 {
						t.Errorf("HandlerSucceeded events of the first handler: %q, want one", got)
					}
				})
			}
		}
	}
}

// A subhandler whose result the server refuses fails for good, and so does its
// parent (kopf: a parent fails when a child does), though the refused write had
// recorded the parent's success: the cause then ends, each handler having run once.
func TestWriteTooLargeFailsTheSubhandlerAndItsParent(t *testing.T) {
	const limit = 100 << 10
	big := strings.Repeat("x", 60<<10)
	h := newFakeHandlers()
	subs := []causes.Spec{changeSpec("parent/one", causes.Create), changeSpec("parent/two", causes.Create)}
	for _, s := range subs {
		h.fns[s.ID] = func(ctx context.Context, call causes.Call) (causes.Result, error) {
			return causes.Result{Value: big}, nil
		}
	}
	h.add(changeSpec("parent", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Subhandlers: subs}, nil
	})
	events := &eventLog{}
	post := true
	e := startEnvWith(t, h, Options{PostEvents: &post, Recorder: events},
		refuseObjectsOver(limit, apierrors.NewInternalError(errors.New("etcdserver: request is too large"))))
	e.create("w", map[string]any{"size": int64(1)})
	e.eventually("the cause ended", func() bool {
		_, ok := e.annotations("w")[state.LastHandledKey("luaop.dev")]
		return ok
	})
	e.clock.Step(2 * time.Minute)
	e.settleIn(widgetsGVR, "w")
	for _, id := range []string{"parent/one", "parent/two"} {
		if n := len(h.callsOf(id, "w")); n != 1 {
			t.Errorf("%s ran %d times, want 1", id, n)
		}
	}
	if got := events.with("HandlerFailed", "parent/two"); len(got) != 2 {
		t.Errorf("HandlerFailed events naming parent/two: %q, want its own and its parent's", got)
	}
	for _, id := range []string{"parent/two", "parent "} {
		if got := events.with("HandlerSucceeded", id); len(got) != 0 {
			t.Errorf("HandlerSucceeded posted for %s: %q", id, got)
		}
	}
	if got := events.with("HandlerSucceeded", "parent/one"); len(got) != 1 {
		t.Errorf("HandlerSucceeded events of parent/one: %q, want one", got)
	}
}
