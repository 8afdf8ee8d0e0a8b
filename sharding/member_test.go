package sharding

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/luaop/luaop/caching"
)

type recordingReleaser struct {
	mu        sync.Mutex
	released  []string
	revisited int
}

func (r *recordingReleaser) Release(_ context.Context, _ schema.GroupVersionResource, ns, name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = append(r.released, name)
	return nil
}

func (r *recordingReleaser) Revisit(schema.GroupVersionResource) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revisited++
}

func (r *recordingReleaser) snapshot() ([]string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.released...), r.revisited
}

func named(name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetNamespace("default")
	u.SetName(name)
	return u
}

// Without the right to patch a resource's objects, the replica watches all of
// them (no selector), says so in the log, and admits those the ring gives it;
// when the members change, it releases what it no longer owns and offers the
// watch's objects again for what it now owns.
func TestFilteredAfterTheWatchWithoutPatchRights(t *testing.T) {
	f := &fixture{t: t, clock: clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)), kube: kubefake.NewClientset()}
	f.meta = metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	f.kube.PrependReactor("create", "selfsubjectaccessreviews", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, &authorizationv1.SelfSubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: false, Reason: "RBAC: no patch"}}, nil
	})
	var logs bytes.Buffer
	var logMu sync.Mutex
	rel := &recordingReleaser{}
	a, err := NewWithClients(Clients{Kube: f.kube, Metadata: f.meta}, Options{Namespace: "luaop", Identity: "a", Clock: f.clock,
		LeaseDuration: 15 * time.Second, Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a.Attach(rel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil }) }()
	if sel := a.Watching(ctx, widgets, []string{"default"}, caching.Selection{}); sel != "" {
		t.Fatalf("a resource luaop may not patch is watched with the selector %q", sel)
	}
	logMu.Lock()
	said := strings.Contains(logs.String(), "luaop may not patch this resource's objects")
	logMu.Unlock()
	if !said {
		t.Fatalf("the fallback is not in the log:\n%s", logs.String())
	}
	f.lease("b")
	f.until("a sees both members", func() bool { return len(a.State().Members) == 2 })

	ring := NewRing([]string{"a", "b"}, 0)
	var mine, theirs []string
	for i := range 40 {
		name := fmt.Sprintf("w-%02d", i)
		owner := ring.Owner(ObjectKey(widgets.Group, widgets.Resource, "default", name))
		if got := a.Admits(widgets, "ADDED", named(name)); got != (owner == "a") {
			t.Fatalf("%s (ring owner %s): admitted %v", name, owner, got)
		}
		if owner == "a" {
			mine = append(mine, name)
		} else {
			theirs = append(theirs, name)
		}
	}
	if st := a.State(); st.Owned != len(mine) || st.Resources[0].Mode != "filtered after the watch" {
		t.Fatalf("state %+v, want %d owned, filtered", st, len(mine))
	}
	// A DELETED of someone else's object is not this replica's either.
	if a.Admits(widgets, "DELETED", named(theirs[0])) {
		t.Fatal("another replica's deletion reached the Reactor")
	}

	// b's lease expires: every object is a's; the watch's objects are offered again.
	_, before := rel.snapshot()
	f.until("b expired and the watch was revisited", func() bool {
		_, revisited := rel.snapshot()
		return len(a.State().Members) == 1 && revisited > before
	})
	for _, name := range theirs {
		if !a.Admits(widgets, "MODIFIED", named(name)) {
			t.Fatalf("%s not admitted once a is the only member", name)
		}
	}
	if released, _ := rel.snapshot(); len(released) != 0 {
		t.Fatalf("released %v: a lost nothing", released)
	}

	// b joins again: what the ring gives b is released by a.
	f.lease("b2")
	f.until("a releases what b2 now owns", func() bool {
		released, _ := rel.snapshot()
		return len(a.State().Members) == 2 && len(released) > 0 && a.State().Draining == 0
	})
	ring = NewRing([]string{"a", "b2"}, 0)
	released, _ := rel.snapshot()
	for _, name := range released {
		if ring.Owner(ObjectKey(widgets.Group, widgets.Resource, "default", name)) != "b2" {
			t.Fatalf("released %s, which the ring still gives a", name)
		}
	}
	cancel()
	<-done
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
