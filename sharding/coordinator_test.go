package sharding

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubefake "k8s.io/client-go/kubernetes/fake"
	metadatafake "k8s.io/client-go/metadata/fake"
	clienttesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/luaop/luaop/caching"
)

var testLogOut io.Writer = io.Discard

var widgets = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}

// fakeReleaser is the Reactor's side: Release blocks until the test lets it go
// (the cycle in flight), and records the order of events.
type fakeReleaser struct {
	mu       sync.Mutex
	gate     chan struct{}
	released []string
	log      *[]string
	logMu    *sync.Mutex
}

func (f *fakeReleaser) Release(ctx context.Context, gvr schema.GroupVersionResource, ns, name string) error {
	select {
	case <-f.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.mu.Lock()
	f.released = append(f.released, ns+"/"+name)
	f.mu.Unlock()
	f.logMu.Lock()
	*f.log = append(*f.log, "released "+name)
	f.logMu.Unlock()
	return nil
}

func (f *fakeReleaser) Revisit(schema.GroupVersionResource) {}

type fixture struct {
	t     *testing.T
	clock *clocktesting.FakeClock
	kube  *kubefake.Clientset
	meta  *metadatafake.FakeMetadataClient
	log   []string
	logMu sync.Mutex
}

func newFixture(t *testing.T, objects int) *fixture {
	f := &fixture{t: t, clock: clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)), kube: kubefake.NewClientset()}
	// luaop may patch widgets: they are sharded by label.
	f.kube.PrependReactor("create", "selfsubjectaccessreviews", func(a clienttesting.Action) (bool, runtime.Object, error) {
		return true, &authorizationv1.SelfSubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: true}}, nil
	})
	scheme := metadatafake.NewTestScheme()
	_ = metav1.AddMetaToScheme(scheme)
	var objs []runtime.Object
	for i := range objects {
		objs = append(objs, widget(fmt.Sprintf("w-%02d", i)))
	}
	f.meta = metadatafake.NewSimpleMetadataClient(scheme, objs...)
	f.meta.PrependReactor("patch", "widgets", func(a clienttesting.Action) (bool, runtime.Object, error) {
		p := a.(clienttesting.PatchAction)
		f.logMu.Lock()
		f.log = append(f.log, "patch "+p.GetName()+" "+string(p.GetPatch()))
		f.logMu.Unlock()
		return false, nil, nil
	})
	return f
}

func widget(name string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "example.com/v1", Kind: "Widget"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
}

func (f *fixture) sharding(identity string, rel Releaser) *Sharding {
	s, err := NewWithClients(Clients{Kube: f.kube, Metadata: f.meta}, Options{Namespace: "luaop", Identity: identity,
		Clock: f.clock, LeaseDuration: 15 * time.Second, Logger: slog.New(slog.NewTextHandler(testLogOut, nil))})
	if err != nil {
		f.t.Fatal(err)
	}
	if rel != nil {
		s.Attach(rel)
	}
	return s
}

// lease writes a member's Lease as a replica would, renewed at the clock's now.
func (f *fixture) lease(member string) {
	now := metav1.NewMicroTime(f.clock.Now())
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "luaop", Name: "luaop-member-" + member, Labels: map[string]string{GroupLabel: "luaop"}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(member), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &now}}
	if _, err := f.kube.CoordinationV1().Leases("luaop").Create(context.Background(), l, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) objects() map[string]*metav1.PartialObjectMetadata {
	list, err := f.meta.Resource(widgets).Namespace("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]*metav1.PartialObjectMetadata{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// until steps the fake clock in small steps (timers, debounce, tickers) until
// cond holds; the goroutines under test run between the steps.
func (f *fixture) until(what string, cond func() bool) {
	f.t.Helper()
	for range 3000 {
		if cond() {
			return
		}
		f.clock.Step(20 * time.Millisecond)
		time.Sleep(2 * time.Millisecond)
	}
	f.t.Fatalf("never: %s", what)
}

func asUnstructured(m *metav1.PartialObjectMetadata) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetNamespace(m.Namespace)
	u.SetName(m.Name)
	u.SetLabels(m.Labels)
	u.SetAnnotations(m.Annotations)
	return u
}

// The coordinator assigns new objects; when a member joins, it marks objects for
// handover and leaves their label alone; the owner releases each (cycle in flight
// done, daemons stopped) before the label moves, in one conditional write; a
// member whose Lease expires loses its objects without a handshake.
func TestCoordinatorHandover(t *testing.T) {
	f := newFixture(t, 40)
	rel := &fakeReleaser{gate: make(chan struct{}), log: &f.log, logMu: &f.logMu}
	a := f.sharding("a", rel)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil }) }()
	if sel := a.Watching(ctx, widgets, []string{""}, caching.Selection{}); sel != "luaop.dev/shard=a" {
		t.Fatalf("selector %q", sel)
	}

	f.until("every object is assigned to the only member", func() bool {
		for _, o := range f.objects() {
			if o.Labels["luaop.dev/shard"] != "a" {
				return false
			}
		}
		return true
	})

	// b joins: about half the objects are marked for it; none changes owner yet.
	// a's watch (selector shard=a) delivers what changed to Admits, as the
	// Reactor's informer would.
	w := &fakeWatch{f: f, s: a, member: "a", seen: map[string]bool{}}
	f.lease("b")
	var marked []string
	f.until("objects are marked for the member that joined, and a holds back", func() bool {
		if refused := w.deliver(); len(refused) > 0 {
			marked = append(marked, refused...)
		}
		return len(marked) >= 16 && a.State().Draining == len(marked)
	})
	for range 20 { // the release is in flight: nothing moves, however long it takes
		f.clock.Step(100 * time.Millisecond)
		time.Sleep(time.Millisecond)
		marked = append(marked, w.deliver()...)
	}
	if len(marked) > 24 {
		t.Fatalf("%d of 40 objects marked for the second member", len(marked))
	}
	for _, o := range f.objects() {
		if o.Labels["luaop.dev/shard"] != "a" {
			t.Fatalf("%s was relabelled before its owner released it: %v", o.Name, o.Labels)
		}
	}
	close(rel.gate)
	f.until("the marked objects are b's, and a's watch lost them", func() bool {
		marked = append(marked, w.deliver()...)
		for _, name := range marked {
			got := f.objects()[name]
			if got.Labels["luaop.dev/shard"] != "b" || got.Annotations["luaop.dev/shard-handover"] != "" {
				return false
			}
		}
		return a.State().Draining == 0
	})
	// Release before the label write, for every object.
	f.logMu.Lock()
	releasedAt := map[string]int{}
	for i, line := range f.log {
		var name string
		if _, err := fmt.Sscanf(line, "released %s", &name); err == nil {
			releasedAt[name] = i
		}
	}
	moves := 0
	for i, line := range f.log {
		var name, body string
		if _, err := fmt.Sscanf(line, "patch %s %s", &name, &body); err == nil && len(body) > 0 && body[0] == '[' {
			moves++
			if at, ok := releasedAt[name]; !ok || at > i {
				t.Errorf("%s: its label moved before it was released", name)
			}
		}
	}
	f.logMu.Unlock()
	if moves != len(marked) || w.admittedAfterMark > 0 {
		t.Fatalf("%d label moves for %d marked objects; %d notifications admitted after a mark", moves, len(marked), w.admittedAfterMark)
	}
	if st := a.State(); st.Owned != 40-len(marked) || st.Released != int64(len(marked)) {
		t.Fatalf("state %+v", st)
	}

	// b stops renewing: once its lease expired, its objects are a's again, with no
	// handover mark (nobody is there to release them).
	f.until("the expired member's objects are reassigned", func() bool {
		for _, o := range f.objects() {
			if o.Labels["luaop.dev/shard"] != "a" || o.Annotations["luaop.dev/shard-handover"] != "" {
				return false
			}
		}
		return true
	})
	if elapsed := f.clock.Since(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)); elapsed < 15*time.Second {
		t.Fatalf("reassigned after %s, before the lease expired", elapsed)
	}
	cancel()
	if err := <-runDone; err != nil {
		t.Fatal(err)
	}
	if _, err := f.kube.CoordinationV1().Leases("luaop").Get(context.Background(), "luaop-member-a", metav1.GetOptions{}); err == nil {
		t.Fatal("the membership Lease is still there after a clean stop")
	}
}

// fakeWatch is member's label-selected watch: what entered it is ADDED, what
// changed in it MODIFIED, what left it DELETED with its previous content (as the
// API server's watch cache sends it).
type fakeWatch struct {
	f                 *fixture
	s                 *Sharding
	member            string
	seen              map[string]bool
	last              map[string]*metav1.PartialObjectMetadata
	refused           map[string]bool
	admittedAfterMark int
}

// deliver sends what changed since the last call; it returns the objects the
// member refused that carry a handover mark.
func (w *fakeWatch) deliver() (refused []string) {
	if w.last == nil {
		w.last, w.refused = map[string]*metav1.PartialObjectMetadata{}, map[string]bool{}
	}
	for name, o := range w.f.objects() {
		in := o.Labels["luaop.dev/shard"] == w.member
		switch {
		case in && !w.seen[name]:
			w.s.Admits(widgets, "ADDED", asUnstructured(o))
		case in && o.ResourceVersion != w.last[name].ResourceVersion || in && fmt.Sprint(o.Annotations) != fmt.Sprint(w.last[name].Annotations):
			if w.s.Admits(widgets, "MODIFIED", asUnstructured(o)) {
				if o.Annotations["luaop.dev/shard-handover"] != "" {
					w.admittedAfterMark++
				}
			} else if o.Annotations["luaop.dev/shard-handover"] != "" && !w.refused[name] {
				w.refused[name] = true
				refused = append(refused, name)
			}
		case !in && w.seen[name]:
			if w.s.Admits(widgets, "DELETED", asUnstructured(w.last[name])) {
				w.admittedAfterMark++ // the selector's DELETED must not reach the Reactor
			}
		}
		w.seen[name] = in
		w.last[name] = o
	}
	return refused
}

// Only what the handlers select is shared out: with a label filter on the watch,
// the coordinator lists, labels and counts those objects only (the others are no
// replica's: no handler of this resource would see them).
func TestCoordinatorSharesOutOnlyTheHandlersSelection(t *testing.T) {
	f := newFixture(t, 0)
	for i := range 12 {
		w := widget(fmt.Sprintf("w-%02d", i))
		if i%3 == 0 {
			w.Labels = map[string]string{"tier": "hot"}
		}
		if err := f.meta.Tracker().Add(w); err != nil {
			t.Fatal(err)
		}
	}
	a := f.sharding("a", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil }) }()
	a.Watching(ctx, widgets, []string{""}, caching.Selection{Labels: "tier=hot"})
	f.until("the selected objects are assigned", func() bool {
		for _, o := range f.objects() {
			if o.Labels["tier"] == "hot" && o.Labels["luaop.dev/shard"] != "a" {
				return false
			}
		}
		return true
	})
	for range 10 { // passes after the assignment: still nothing else labelled
		f.clock.Step(100 * time.Millisecond)
		time.Sleep(time.Millisecond)
	}
	for _, o := range f.objects() {
		if o.Labels["tier"] != "hot" && o.Labels["luaop.dev/shard"] != "" {
			t.Errorf("%s, which the handlers do not select, was labelled %v", o.Name, o.Labels)
		}
	}
	cancel()
	<-runDone
}
