package sharding

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// stalls makes Lease calls go unanswered, as a request lost or stuck on its
// connection: a stalled call returns only when its context ends.
type stalls struct {
	mu      sync.Mutex
	left    int // calls still to stall; -1: all
	stalled int // calls stalled so far
	// answer, when set, lets the first stalled call go on (a slow answer).
	answer chan struct{}
}

// take tells whether a call stalls; it stalls it until its context ends (or,
// the first, until answer is closed).
func (st *stalls) take(ctx context.Context) bool {
	st.mu.Lock()
	if st.left == 0 {
		st.mu.Unlock()
		return false
	}
	if st.left > 0 {
		st.left--
	}
	st.stalled++
	answer := st.answer
	if st.stalled > 1 {
		answer = nil
	}
	st.mu.Unlock()
	select {
	case <-ctx.Done():
		return true
	case <-answer:
		return false
	}
}

func (st *stalls) set(n int) {
	st.mu.Lock()
	st.left = n
	st.mu.Unlock()
}

func (st *stalls) count() int {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.stalled
}

type stallingKube struct {
	kubernetes.Interface
	st *stalls
}

func (k stallingKube) CoordinationV1() coordinationclient.CoordinationV1Interface {
	return stallingCoordination{k.Interface.CoordinationV1(), k.st}
}

type stallingCoordination struct {
	coordinationclient.CoordinationV1Interface
	st *stalls
}

func (c stallingCoordination) Leases(ns string) coordinationclient.LeaseInterface {
	return stallingLeases{c.CoordinationV1Interface.Leases(ns), c.st}
}

type stallingLeases struct {
	coordinationclient.LeaseInterface
	st *stalls
}

func (l stallingLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordinationv1.Lease, error) {
	if l.st.take(ctx) {
		return nil, ctx.Err()
	}
	return l.LeaseInterface.Get(ctx, name, o)
}

func (l stallingLeases) Create(ctx context.Context, lease *coordinationv1.Lease, o metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if l.st.take(ctx) {
		return nil, ctx.Err()
	}
	return l.LeaseInterface.Create(ctx, lease, o)
}

func (l stallingLeases) Update(ctx context.Context, lease *coordinationv1.Lease, o metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if l.st.take(ctx) {
		return nil, ctx.Err()
	}
	return l.LeaseInterface.Update(ctx, lease, o)
}

// renewing is one replica's membership, joined at the fake clock's now, its
// renewals running (keepRenewed) until the test ends.
type renewing struct {
	f      *fixture
	s      *Sharding
	st     *stalls
	joined time.Time
	mu     sync.Mutex
	lostAt time.Time
}

func startRenewing(t *testing.T, answer chan struct{}) *renewing {
	f := newFixture(t, 0)
	r := &renewing{f: f, st: &stalls{answer: answer}}
	s, err := NewWithClients(Clients{Kube: stallingKube{f.kube, r.st}, Metadata: f.meta}, Options{Namespace: "luaop", Identity: "a",
		Clock: f.clock, LeaseDuration: 15 * time.Second, Logger: slog.New(slog.NewTextHandler(testLogOut, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r.s = s
	ctx, cancel := context.WithCancel(context.Background())
	joined, err := s.ms.renewBy(ctx, f.clock.Now().Add(s.opts.RenewDeadline))
	if err != nil {
		t.Fatal(err)
	}
	r.joined = joined
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.ms.keepRenewed(ctx, joined, func() {
			r.mu.Lock()
			r.lostAt = f.clock.Now()
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func (r *renewing) lost() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lostAt, !r.lostAt.IsZero()
}

func (r *renewing) renewedAt() time.Time {
	l, err := r.f.kube.CoordinationV1().Leases("luaop").Get(context.Background(), "luaop-member-a", metav1.GetOptions{})
	if err != nil {
		r.f.t.Fatal(err)
	}
	return l.Spec.RenewTime.Time
}

// One renewal the server does not answer costs an attempt, not the membership:
// another attempt beside it, within the renew deadline, renews the Lease, and the
// renewals go on.
func TestMembershipSurvivesAnUnansweredRenewal(t *testing.T) {
	r := startRenewing(t, nil)
	r.st.set(1)
	r.f.until("the Lease is renewed after the unanswered attempt", func() bool {
		return r.st.count() == 1 && r.renewedAt().After(r.joined.Add(r.s.opts.RenewEvery))
	})
	r.f.until("the renewals go on", func() bool { return r.renewedAt().After(r.joined.Add(3 * r.s.opts.LeaseDuration)) })
	if at, lost := r.lost(); lost {
		t.Fatalf("membership lost %s after joining, though only one renewal went unanswered", at.Sub(r.joined))
	}
}

// A server that never answers loses the membership at the renew deadline after
// the last renewal, not later (the others take the objects soon after), and not
// before.
func TestMembershipLostAtTheRenewDeadline(t *testing.T) {
	r := startRenewing(t, nil)
	r.st.set(-1)
	deadline := r.joined.Add(r.s.opts.RenewDeadline)
	// One attempt at RenewEvery, another beside it every quarter of the deadline:
	// the third is the last before the deadline, and none is answered.
	r.f.until("three renewal attempts went unanswered", func() bool { return r.st.count() == 3 })
	r.f.clock.SetTime(deadline.Add(-time.Millisecond))
	time.Sleep(50 * time.Millisecond)
	if at, lost := r.lost(); lost {
		t.Fatalf("membership lost %s before the renew deadline", deadline.Sub(at))
	}
	r.f.clock.SetTime(deadline)
	for range 1000 {
		if at, lost := r.lost(); lost {
			if !at.Equal(deadline) {
				t.Fatalf("membership lost %s after the renew deadline", at.Sub(deadline))
			}
			if held := r.s.opts.held(); held <= r.s.opts.RenewDeadline || held > r.s.opts.LeaseDuration {
				t.Fatalf("the Lease holds %s: not between the renew deadline %s and the lease duration %s", held, r.s.opts.RenewDeadline, r.s.opts.LeaseDuration)
			}
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("membership not lost at the renew deadline, though no renewal was answered")
}

// A server that answers slowly (a renewal answered after seconds, the attempts
// beside it still unanswered) is still heard: the late answer is the renewal.
func TestMembershipHearsASlowAnswer(t *testing.T) {
	answer := make(chan struct{})
	r := startRenewing(t, answer)
	r.st.set(-1)
	r.f.until("a second attempt beside the first", func() bool { return r.st.count() == 2 })
	r.st.set(0)
	close(answer)
	r.f.until("the first attempt's late answer renewed the Lease", func() bool {
		first := r.joined.Add(r.s.opts.RenewEvery) // the first attempt's start; the second's is a quarter of the deadline later
		at := r.renewedAt()
		return !at.Before(first) && at.Before(first.Add(r.s.opts.RenewDeadline/4))
	})
	r.f.until("the renewals go on", func() bool { return r.renewedAt().After(r.joined.Add(3 * r.s.opts.LeaseDuration)) })
	if at, lost := r.lost(); lost {
		t.Fatalf("membership lost %s after joining, though the server answered within the deadline", at.Sub(r.joined))
	}
}

// A replica whose membership is lost is told to stop writing at once before its
// work's context ends (the Reactor then cancels its cycles and daemons with no
// grace: the Lease holds only a margin past the renew deadline), and Run returns
// ErrMembershipLost; while it is a member, it is not told.
func TestALostMembershipStopsWritingAtOnce(t *testing.T) {
	f := newFixture(t, 0)
	var refuse atomic.Bool
	for _, verb := range []string{"get", "update", "create"} {
		f.kube.PrependReactor(verb, "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
			if refuse.Load() { // the coordinator's Lease too: this replica is alone
				return true, nil, errors.New("the server is unavailable")
			}
			return false, nil, nil
		})
	}
	s, err := NewWithClients(Clients{Kube: f.kube, Metadata: f.meta}, Options{Namespace: "luaop", Identity: "a",
		Clock: f.clock, LeaseDuration: 15 * time.Second, Logger: slog.New(slog.NewTextHandler(testLogOut, nil))})
	if err != nil {
		t.Fatal(err)
	}
	working := make(chan struct{})
	toldFirst := make(chan bool, 1)
	done := make(chan error, 1)
	go func() {
		done <- s.Run(context.Background(), func(ctx context.Context) error {
			close(working)
			<-ctx.Done()
			select {
			case <-s.StopWritingAtOnce():
				toldFirst <- true
			default:
				toldFirst <- false
			}
			return nil
		})
	}()
	select {
	case <-working:
	case <-time.After(20 * time.Second):
		t.Fatal("Run never started the work")
	}
	joinedAt := f.clock.Now()
	f.until("a member that renewed its Lease since it joined", func() bool {
		l, err := f.kube.CoordinationV1().Leases("luaop").Get(context.Background(), "luaop-member-a", metav1.GetOptions{})
		return err == nil && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(joinedAt) && len(s.State().Members) == 1
	})
	select {
	case <-s.StopWritingAtOnce():
		t.Fatal("told to stop writing while a member")
	default:
	}
	refuse.Store(true) // the server refuses every renewal from now on
	f.until("the membership is lost", func() bool { return len(done) == 1 || len(toldFirst) == 1 })
	if told := <-toldFirst; !told {
		t.Error("the work's context ended before the replica was told to stop writing at once")
	}
	if err := <-done; !errors.Is(err, ErrMembershipLost) {
		t.Errorf("Run returned %v, want ErrMembershipLost", err)
	}
}

// A Lease seen for the first time is judged from the moment it was seen, not by
// its renewTime (the member's clock, which may be behind): its member stays live
// for the Lease's duration from then, and no longer.
func TestALeaseSeenFirstIsJudgedByLocalTime(t *testing.T) {
	f := newFixture(t, 0)
	s := f.sharding("a", nil)
	now := f.clock.Now()
	behind := metav1.NewMicroTime(now.Add(-time.Hour)) // a member whose clock is an hour behind
	seconds := int32(10)
	s.ms.observe(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "luaop-member-b"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("b"), RenewTime: &behind, LeaseDurationSeconds: &seconds}}, false)
	for _, tc := range []struct {
		at   time.Duration
		live bool
	}{{0, true}, {9 * time.Second, true}, {10 * time.Second, false}} {
		members, _ := s.ms.live(now.Add(tc.at))
		if got := len(members) == 1; got != tc.live {
			t.Errorf("%s after it was first seen: live %v, want %v", tc.at, got, tc.live)
		}
	}
}
