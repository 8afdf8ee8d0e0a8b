package processing

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/processing/causes"
)

// testShard admits every notification until refuse is set (an object marked for
// handover), and counts what it refused.
type testShard struct {
	refuse  atomic.Bool
	refused atomic.Int32
}

func (s *testShard) Watching(context.Context, schema.GroupVersionResource, []string, caching.Selection) string {
	return ""
}
func (s *testShard) Admits(schema.GroupVersionResource, string, *unstructured.Unstructured) bool {
	if s.refuse.Load() {
		s.refused.Add(1)
		return false
	}
	return true
}

// Release (a handover to another replica): the cycle in flight finishes and its
// patch is written, the object's daemon gets its stop flag (not a cancellation:
// the object lives on) and exits, its memo is forgotten, and Release returns only
// then. Afterwards nothing of the object runs here until the Shard admits it again.
func TestReleaseFinishesTheCycleThenStopsDaemonsAndForgets(t *testing.T) {
	h := newFakeHandlers()
	inHandler, finish := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.add(changeSpec("create", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		once.Do(func() { close(inHandler) })
		<-finish
		return causes.Result{Value: "done"}, nil
	})
	h.add(changeSpec("update", causes.Update), nil)
	var daemonStoppedByFlag, daemonCancelled atomic.Bool
	h.addDaemon(causes.Spec{ID: "beat", Kind: causes.KindDaemon, Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		select {
		case <-call.Daemon.Stopped.Done():
			daemonStoppedByFlag.Store(true)
		case <-ctx.Done():
			daemonCancelled.Store(true)
		}
		return nil
	})
	shard := &testShard{}
	e := startEnv(t, h, Options{Shard: shard})
	uid := e.create("w1", nil)
	<-inHandler
	e.eventually("the daemon runs", func() bool { return e.op.daemons.count() == 1 })

	// Marked for handover: the shard refuses the object from now on.
	shard.refuse.Store(true)
	released := make(chan error, 1)
	go func() { released <- e.op.Release(context.Background(), widgets.GroupVersionResource, "default", "w1") }()
	e.never("Release returning while the cycle is in flight", func() bool { return len(released) > 0 })
	if daemonStoppedByFlag.Load() || daemonCancelled.Load() {
		t.Fatal("the daemon was stopped before the cycle in flight finished")
	}
	close(finish)
	select {
	case err := <-released:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Release did not return")
	}
	if v, _, _ := unstructured.NestedString(e.get("w1").Object, "status", "create"); v != "done" {
		t.Fatalf("the cycle in flight was not written before the release: status %v", e.get("w1").Object["status"])
	}
	if !daemonStoppedByFlag.Load() || daemonCancelled.Load() {
		t.Fatalf("the daemon: stopped by its flag %v, cancelled %v; want stopped by its flag", daemonStoppedByFlag.Load(), daemonCancelled.Load())
	}
	if !slices.Contains(h.forgottenUIDs(), uid) {
		t.Fatal("the memo was not forgotten")
	}
	if e.op.objects.get(objectKey{resource: widgets, namespace: "default", name: "w1"}) != nil {
		t.Fatal("the object's state is still kept")
	}

	// Changes while another replica owns it run nothing here.
	e.patch("w1", `{"spec":{"size":2}}`)
	e.eventually("the change was refused by the shard", func() bool { return shard.refused.Load() > 0 })
	e.never("a handler run after the release", func() bool { return len(h.callsOf("update", "w1")) > 0 || e.op.daemons.count() > 0 })

	// Given back: the next notification brings it in as any object.
	shard.refuse.Store(false)
	e.patch("w1", `{"spec":{"size":3}}`)
	e.eventually("handled again once admitted", func() bool { return len(h.callsOf("update", "w1")) == 1 && e.op.daemons.count() == 1 })
}

// In sharded mode an object new to the Reactor after its initial listing (moved
// here from another replica, or created and assigned here) is handled before the
// backlog of changes of the objects it already owned; unsharded, the queue stays
// FIFO. One worker, held in the handler of a gate object while every owned object
// changes and then a newcomer is created: once released, the order of the handler
// runs tells.
func TestShardNewcomerIsHandledBeforeTheBacklog(t *testing.T) {
	const owned = 8
	cases := []struct {
		name         string
		shard        Shard
		newcomerRuns int // the newcomer's handler run among the runs after the gate: its index
	}{
		{"sharded: the newcomer first", &testShard{}, 0},
		{"unsharded: in order of arrival", nil, owned},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newFakeHandlers()
			inGate, openGate := make(chan struct{}), make(chan struct{})
			h.add(changeSpec("create", causes.Create), nil)
			h.add(changeSpec("update", causes.Update), func(ctx context.Context, call causes.Call) (causes.Result, error) {
				if meta, _ := call.Cause.Body["metadata"].(map[string]any); meta["name"] == "gate" {
					close(inGate)
					<-openGate
				}
				return causes.Result{}, nil
			})
			var objects []*unstructured.Unstructured
			names := []string{"gate"}
			for i := range owned {
				names = append(names, fmt.Sprintf("w%d", i))
			}
			for _, name := range names {
				objects = append(objects, widgetObject(name, "uid-"+name, map[string]any{"size": int64(1)}))
			}
			e := startEnv(t, h, Options{Shard: tc.shard, Workers: 1}, objects...)
			e.eventually("the initial listing handled", e.op.Synced)
			for _, name := range names {
				e.settleIn(widgetsGVR, name)
			}

			// The one worker is held in the gate's handler; the owned objects'
			// changes queue up behind it, then the newcomer arrives.
			e.patch("gate", `{"spec":{"size":2}}`)
			<-inGate
			for _, name := range names[1:] {
				e.patch(name, `{"spec":{"size":2}}`)
			}
			e.eventually("the owned objects' changes queued", func() bool { return e.op.queue.Len() == owned })
			e.create("newcomer", map[string]any{"size": int64(1)})
			e.eventually("the newcomer queued", func() bool { return e.op.queue.Len() == owned+1 })
			h.mu.Lock()
			before := len(h.calls)
			h.mu.Unlock()
			close(openGate)
			e.eventually("every change handled", func() bool {
				return len(h.callsOf("create", "newcomer")) == 1 && len(h.callsOf("update", "")) == owned+1
			})

			h.mu.Lock()
			var order []string
			for _, c := range h.calls[before:] {
				order = append(order, c.id+" "+c.name)
			}
			h.mu.Unlock()
			if len(order) != owned+1 || order[tc.newcomerRuns] != "create newcomer" {
				t.Fatalf("handler runs after the gate opened: %v; want the newcomer's create at index %d", order, tc.newcomerRuns)
			}
		})
	}
}
