package processing

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/processing/causes"
)

// testShard admits every notification until refuse is set (an object marked for
// handover), and counts what it refused.
type testShard struct {
	refuse  atomic.Bool
	refused atomic.Int32
}

func (s *testShard) Watching(context.Context, schema.GroupVersionResource, []string) string {
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
