package leader

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// fakeLeases is an in-memory Lease store with the server's optimistic concurrency,
// and watches (refused with noWatch, as without the RBAC verb).
type fakeLeases struct {
	coordinationv1client.LeaseInterface // nil: only Get, Create, Update and Watch are used
	mu                                  sync.Mutex
	lease                               *coordinationv1.Lease
	version                             int
	watchers                            []*watch.RaceFreeFakeWatcher
	noWatch                             bool
}

func (f *fakeLeases) Watch(_ context.Context, _ metav1.ListOptions) (watch.Interface, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noWatch {
		return nil, apierrors.NewForbidden(leasesResource, "test", errors.New("cannot watch leases"))
	}
	w := watch.NewRaceFreeFake()
	if f.lease != nil {
		w.Add(f.lease.DeepCopy())
	}
	f.watchers = append(f.watchers, w)
	return w, nil
}

var leasesResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func (f *fakeLeases) Leases(string) coordinationv1client.LeaseInterface { return f }

func (f *fakeLeases) Get(_ context.Context, name string, _ metav1.GetOptions) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lease == nil {
		return nil, apierrors.NewNotFound(leasesResource, name)
	}
	return f.lease.DeepCopy(), nil
}

func (f *fakeLeases) Create(_ context.Context, l *coordinationv1.Lease, _ metav1.CreateOptions) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lease != nil {
		return nil, apierrors.NewAlreadyExists(leasesResource, l.Name)
	}
	return f.store(l), nil
}

func (f *fakeLeases) Update(_ context.Context, l *coordinationv1.Lease, _ metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lease == nil {
		return nil, apierrors.NewNotFound(leasesResource, l.Name)
	}
	if l.ResourceVersion != f.lease.ResourceVersion {
		return nil, apierrors.NewConflict(leasesResource, l.Name, errors.New("the object has been modified"))
	}
	return f.store(l), nil
}

func (f *fakeLeases) store(l *coordinationv1.Lease) *coordinationv1.Lease {
	f.version++
	created := f.lease == nil
	f.lease = l.DeepCopy()
	f.lease.ResourceVersion = strconv.Itoa(f.version)
	f.notify(created)
	return f.lease.DeepCopy()
}

// notify sends the stored lease to the open watches (f.mu held).
func (f *fakeLeases) notify(created bool) {
	open := f.watchers[:0]
	for _, w := range f.watchers {
		if w.IsStopped() {
			continue
		}
		if created {
			w.Add(f.lease.DeepCopy())
		} else {
			w.Modify(f.lease.DeepCopy())
		}
		open = append(open, w)
	}
	f.watchers = open
}

func (f *fakeLeases) holder() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lease == nil || f.lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *f.lease.Spec.HolderIdentity
}

// steal makes another instance the holder of a lease that stays valid for a while.
func (f *fakeLeases) steal(identity string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.lease.DeepCopy()
	d := int32(60)
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = &identity, &d, &now
	f.version++
	l.ResourceVersion = strconv.Itoa(f.version)
	f.lease = l
	f.notify(false)
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func fastOptions(identity string, log *syncBuffer) Options {
	return Options{
		Namespace: "ns", Name: "test", Identity: identity,
		LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

func newTestElector(t *testing.T, leases *fakeLeases, opts Options) *Elector {
	t.Helper()
	opts, err := opts.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newElector(leases, opts)
}

// candidate runs an Elector in the background; its lead waits for its context and
// records when it ran.
type candidate struct {
	e        *Elector
	cancel   context.CancelFunc
	started  chan struct{}
	done     chan error
	mu       sync.Mutex
	leadEnd  time.Time
	holderAt string // the lease holder when lead returned
}

func startCandidate(t *testing.T, leases *fakeLeases, opts Options) *candidate {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	c := &candidate{e: newTestElector(t, leases, opts), cancel: cancel, started: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		c.done <- c.e.Run(ctx, func(ctx context.Context) error {
			close(c.started)
			<-ctx.Done()
			time.Sleep(300 * time.Millisecond) // finishing the work in flight
			c.mu.Lock()
			c.leadEnd, c.holderAt = time.Now(), leases.holder()
			c.mu.Unlock()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-c.done:
		case <-time.After(5 * time.Second):
			t.Error("Run did not return")
		}
	})
	return c
}

func waitFor(t *testing.T, ch <-chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("after %s: %s", timeout, what)
	}
}

// waitLogged waits until log holds what.
func waitLogged(t *testing.T, log *syncBuffer, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(log.String(), what); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s, no %q in the log:\n%s", what, log.String())
		}
	}
}

func waitRun(t *testing.T, c *candidate) error {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func TestOptions(t *testing.T) {
	o, err := Options{Namespace: "ns"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Name != "luaop" || o.LeaseDuration != 15*time.Second || o.RenewDeadline != 10*time.Second || o.RetryPeriod != 2*time.Second || o.Logger == nil {
		t.Errorf("defaults: %+v", o)
	}
	if host, _ := os.Hostname(); !strings.HasPrefix(o.Identity, host+"_") || len(o.Identity) != len(host)+9 {
		t.Errorf("identity %q: want %s_xxxxxxxx", o.Identity, host)
	}
	if o2, _ := (Options{Namespace: "ns"}).withDefaults(); o2.Identity == o.Identity {
		t.Errorf("two processes on one host got the same identity %q", o.Identity)
	}

	bad := []struct {
		opts Options
		want string
	}{
		{Options{Namespace: "ns", LeaseDuration: 1500 * time.Millisecond, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond}, "whole number of seconds"},
		{Options{Namespace: "ns", LeaseDuration: 10 * time.Second, RenewDeadline: 10 * time.Second}, "less than the lease duration"},
		{Options{Namespace: "ns", LeaseDuration: 5 * time.Second}, "less than the lease duration"}, // default renew deadline 10s
		{Options{Namespace: "ns", RenewDeadline: 2 * time.Second}, "must exceed 1.2"},
		{Options{Namespace: "ns", RetryPeriod: -time.Second}, "must be positive"},
	}
	for _, b := range bad {
		if _, err := b.opts.withDefaults(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: error %v, want %q", b.opts, err, b.want)
		}
	}
	if _, statErr := os.Stat(serviceAccountNamespace); statErr != nil {
		if _, err := (Options{}).withDefaults(); err == nil || !strings.Contains(err.Error(), "namespace") {
			t.Errorf("no namespace outside a Pod: error %v", err)
		}
	}
}

// The leader works until stopped, keeps the lease while its work finishes, then
// releases it; the standby takes over without waiting for the lease to expire.
// The lease lasts a minute and the test gives up well before that, so a takeover
// seen at all comes from the release, never from the expiry: no time bound.
func TestStopReleasesAfterWorkAndStandbyTakesOver(t *testing.T) {
	leases := &fakeLeases{}
	logA, logB := &syncBuffer{}, &syncBuffer{}
	optsA, optsB := fastOptions("a", logA), fastOptions("b", logB)
	optsA.LeaseDuration, optsB.LeaseDuration = time.Minute, time.Minute
	a := startCandidate(t, leases, optsA)
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	b := startCandidate(t, leases, optsB)
	// The standby has tried the lease and found it held (it logs the leader): it
	// must not lead. Its later tries find the same valid lease, renewed by a.
	waitLogged(t, logB, "standing by; leader is a")
	select {
	case <-b.started:
		t.Fatal("the standby leads while the leader holds the lease")
	default:
	}
	if !a.e.IsLeader() || b.e.IsLeader() {
		t.Errorf("IsLeader: a %v, b %v", a.e.IsLeader(), b.e.IsLeader())
	}

	a.cancel()
	if err := waitRun(t, a); err != nil {
		t.Errorf("Run of a stopped leader: %v, want nil", err)
	}
	a.mu.Lock()
	if a.holderAt != "a" {
		t.Errorf("the lease was held by %q while the leader was finishing its work", a.holderAt)
	}
	a.mu.Unlock()
	waitFor(t, b.started, 30*time.Second, "the standby did not take over after the release (the lease lasts a minute)")
	if !strings.Contains(logA.String(), "became leader") || !strings.Contains(logA.String(), "released the lease") {
		t.Errorf("log of a:\n%s", logA.String())
	}
	t.Logf("log of a:\n%s\nlog of b:\n%s", logA.String(), logB.String())
}

// With KeepLeaseOnStop the standby waits for the lease to expire, as after a crash.
func TestKeepLeaseOnStopWaitsForExpiry(t *testing.T) {
	leases := &fakeLeases{}
	optsA := fastOptions("a", &syncBuffer{})
	optsA.KeepLeaseOnStop = true
	a := startCandidate(t, leases, optsA)
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	logB := &syncBuffer{}
	b := startCandidate(t, leases, fastOptions("b", logB))
	waitLogged(t, logB, "standing by; leader is a") // the standby waits when a stops
	a.cancel()
	if err := waitRun(t, a); err != nil {
		t.Errorf("Run: %v", err)
	}
	if h := leases.holder(); h != "a" {
		t.Errorf("holder after a stop that keeps the lease: %q", h)
	}
	a.mu.Lock()
	stoppedAt := a.leadEnd
	a.mu.Unlock()
	waitFor(t, b.started, 10*time.Second, "the standby did not take over after the expiry")
	// A lower bound only, and a sure one however loaded the machine: a leader
	// renews within its renew deadline (500 ms) or stops leading, so the last
	// renewal the standby saw was at most 500 ms before the stop, and it waits a
	// lease duration (1 s) from that sighting.
	if took := time.Since(stoppedAt); took < 500*time.Millisecond {
		t.Errorf("the standby took over %s after the stop, before the lease expired", took)
	}
}

// A leader whose lease is taken stops its work, and Run says so after the work
// returned.
func TestLeadershipLost(t *testing.T) {
	leases := &fakeLeases{}
	log := &syncBuffer{}
	a := startCandidate(t, leases, fastOptions("a", log))
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	leases.steal("intruder")
	err := waitRun(t, a)
	if !errors.Is(err, ErrLeadershipLost) {
		t.Fatalf("Run: %v, want ErrLeadershipLost", err)
	}
	a.mu.Lock()
	if a.leadEnd.IsZero() {
		t.Error("Run returned before lead")
	}
	a.mu.Unlock()
	if h := leases.holder(); h != "intruder" {
		t.Errorf("holder %q: the lost lease was written", h)
	}
	if !strings.Contains(log.String(), "leadership lost") {
		t.Errorf("log:\n%s", log.String())
	}
}

// lead returning on its own ends Run with its error, and frees the lease.
func TestLeadReturns(t *testing.T) {
	leases := &fakeLeases{}
	boom := errors.New("boom")
	e := newTestElector(t, leases, fastOptions("a", &syncBuffer{}))
	err := e.Run(t.Context(), func(context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Errorf("Run: %v, want boom", err)
	}
	if h := leases.holder(); h != "" {
		t.Errorf("holder %q after lead returned", h)
	}
}

// A standby whose context ends leaves without calling lead.
func TestStandbyStops(t *testing.T) {
	leases := &fakeLeases{}
	a := startCandidate(t, leases, fastOptions("a", &syncBuffer{}))
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	called := false
	err := newTestElector(t, leases, fastOptions("b", &syncBuffer{})).Run(ctx, func(context.Context) error { called = true; return nil })
	if err != nil || called {
		t.Errorf("Run of a standby: %v, lead called %v", err, called)
	}
	if h := leases.holder(); h != "a" {
		t.Errorf("holder %q", h)
	}
}

// slowRetries: without a wake-up, a standby would find a released lease only at
// its next try, 60 s or more later.
func slowRetries(identity string, log *syncBuffer) Options {
	o := fastOptions(identity, log)
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 200*time.Second, 100*time.Second, time.Minute
	return o
}

// A release wakes the standby: it takes the lease long before its next retry.
func TestReleaseWakesStandby(t *testing.T) {
	leases := &fakeLeases{}
	logB := &syncBuffer{}
	a := startCandidate(t, leases, slowRetries("a", &syncBuffer{}))
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	b := startCandidate(t, leases, slowRetries("b", logB))
	waitLogged(t, logB, "standing by; leader is a")
	a.cancel()
	if err := waitRun(t, a); err != nil {
		t.Errorf("Run of a stopped leader: %v", err)
	}
	// 30 s: a sure bound however loaded the machine, and half of b's retry period.
	waitFor(t, b.started, 30*time.Second, "the standby did not take the released lease before its next retry")
	if h := leases.holder(); h != "b" {
		t.Errorf("holder %q, want b", h)
	}
	if !strings.Contains(logB.String(), "the lease was released") {
		t.Errorf("the standby was not woken by the release:\n%s", logB.String())
	}
}

// Without the permission to watch leases, the standby still takes over, at a retry.
func TestReleaseWithoutWatchStillHandsOver(t *testing.T) {
	leases := &fakeLeases{noWatch: true}
	optsA, optsB := fastOptions("a", &syncBuffer{}), fastOptions("b", &syncBuffer{})
	optsA.LeaseDuration, optsB.LeaseDuration = time.Minute, time.Minute
	a := startCandidate(t, leases, optsA)
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	b := startCandidate(t, leases, optsB)
	a.cancel()
	waitRun(t, a)
	waitFor(t, b.started, 30*time.Second, "the standby did not take over at its retry")
}

// Three standbys woken by one release: exactly one leads, the others stand by and
// none of them writes itself into the lease after its round was called off.
func TestWokenStandbysOneLeads(t *testing.T) {
	leases := &fakeLeases{}
	a := startCandidate(t, leases, slowRetries("a", &syncBuffer{}))
	waitFor(t, a.started, 3*time.Second, "a did not lead")
	var standbys []*candidate
	for _, id := range []string{"b", "c", "d"} {
		log := &syncBuffer{}
		standbys = append(standbys, startCandidate(t, leases, slowRetries(id, log)))
		waitLogged(t, log, "standing by; leader is a")
	}
	a.cancel()
	waitRun(t, a)
	var leader *candidate
	for deadline := time.Now().Add(30 * time.Second); leader == nil && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, c := range standbys {
			if c.e.IsLeader() {
				leader = c
			}
		}
	}
	if leader == nil {
		t.Fatal("no standby took the released lease")
	}
	time.Sleep(200 * time.Millisecond) // the others' woken rounds have tried by now
	leaders := 0
	for _, c := range standbys {
		if c.e.IsLeader() {
			leaders++
		}
	}
	if leaders != 1 || leases.holder() != leader.e.Identity() {
		t.Errorf("%d leaders, lease held by %q, want one: %s", leaders, leases.holder(), leader.e.Identity())
	}
}

// The gate: a round either ends holding the lease or is called off, never both,
// whatever the order.
func TestRoundGate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps func(g *roundGate) (calledOff bool)
	}{
		{"called off first: no write", func(g *roundGate) bool {
			c := g.callOff()
			if g.beginWrite() {
				g.endWrite(true)
			}
			return c
		}},
		{"written first: not called off", func(g *roundGate) bool {
			g.beginWrite()
			c := g.callOff()
			g.endWrite(true)
			return c
		}},
		{"a failed first write, then called off", func(g *roundGate) bool {
			g.beginWrite()
			g.endWrite(false)
			return g.callOff()
		}},
		{"held: a failed renewal keeps it held", func(g *roundGate) bool {
			g.beginWrite()
			g.endWrite(true)
			g.endWrite(false)
			g.beginWrite()
			return g.callOff()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &roundGate{}
			calledOff := tc.steps(g)
			if held := g.state.Load() == gateHeld; held == calledOff {
				t.Errorf("held %v, called off %v: exactly one must be true", held, calledOff)
			}
		})
	}
	// Raced: exactly one of the two wins every time.
	for range 1000 {
		g := &roundGate{}
		var wrote, calledOff bool
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); wrote = g.beginWrite() }()
		go func() { defer wg.Done(); calledOff = g.callOff() }()
		wg.Wait()
		if wrote == calledOff {
			t.Fatalf("raced: wrote %v, called off %v", wrote, calledOff)
		}
	}
}
