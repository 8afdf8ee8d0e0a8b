package sharding

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// ErrMembershipLost is returned by Run when this replica could not renew its
// membership Lease for RenewDeadline: the others take its objects once the lease
// expires, so it stopped handling before that; exit (and be restarted).
var ErrMembershipLost = errors.New("sharding: membership lost (the membership Lease could not be renewed)")

// membership keeps this replica's Lease renewed and follows the Leases of the
// group. Liveness is judged by the time this replica saw a renewal, never by the
// peer's clock (as client-go's leader election does), a Lease seen for the first
// time included.
type membership struct {
	s *Sharding

	mu sync.Mutex // leaf lock: guards seen
	// seen: lease name -> what was observed of it.
	seen map[string]observedLease

	changed func() // told (no lock held) when a Lease came, went or was renewed late

	// lease is this replica's Lease as last written (nil: read it first). Only
	// the goroutine renewing it uses it (renewBy): Run's first renewal, then
	// keepRenewed.
	lease *coordinationv1.Lease
}

type observedLease struct {
	member     string
	renewTime  time.Time // as written in the Lease
	observedAt time.Time // local time the current renewTime was first seen
	duration   time.Duration
}

func (ms *membership) leaseName() string { return ms.s.opts.Group + "-member-" + ms.s.member }

// informer follows the group's Leases.
func (ms *membership) informer() cache.SharedIndexInformer {
	o := ms.s.opts
	f := informers.NewSharedInformerFactoryWithOptions(ms.s.kube, 0, informers.WithNamespace(o.Namespace),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = GroupLabel + "=" + o.Group }))
	inf := f.Coordination().V1().Leases().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { ms.observe(obj, false) },
		UpdateFunc: func(_, obj any) { ms.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			ms.observe(obj, true)
		},
	})
	return inf
}

func (ms *membership) observe(obj any, deleted bool) {
	lease, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	now := ms.s.clock.Now()
	ms.mu.Lock()
	if deleted {
		delete(ms.seen, lease.Name)
	} else {
		var renew time.Time
		if lease.Spec.RenewTime != nil {
			renew = lease.Spec.RenewTime.Time
		}
		var d time.Duration
		if lease.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
		}
		member := ptr.Deref(lease.Spec.HolderIdentity, "")
		prev, known := ms.seen[lease.Name]
		switch {
		case !known:
			// First seen: judged from now, as client-go's leader election does, not
			// by its renewTime: that is the member's clock, and the Lease holds only a
			// margin past the member's renew deadline, so a member whose clock is
			// behind would lose its objects while still handling them. A Lease long
			// dead costs its duration once more (after a coordinator is elected).
			ms.seen[lease.Name] = observedLease{member: member, renewTime: renew, observedAt: now, duration: d}
		case !renew.Equal(prev.renewTime) || member != prev.member || d != prev.duration:
			ms.seen[lease.Name] = observedLease{member: member, renewTime: renew, observedAt: now, duration: d}
		}
	}
	ms.mu.Unlock()
	if ms.changed != nil {
		ms.changed()
	}
}

// live returns the members alive at now, sorted, and when the next of them
// expires (zero when none).
func (ms *membership) live(now time.Time) (members []string, nextExpiry time.Time) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, l := range ms.seen {
		if l.member == "" || l.duration <= 0 {
			continue
		}
		exp := l.observedAt.Add(l.duration)
		if !now.Before(exp) {
			continue
		}
		members = append(members, l.member)
		if nextExpiry.IsZero() || exp.Before(nextExpiry) {
			nextExpiry = exp
		}
	}
	slices.Sort(members)
	return slices.Compact(members), nextExpiry
}

// write writes this replica's Lease with renewTime now (creating it when
// missing), on base, the Lease as last written (nil: read it first), and returns
// it as written.
func (ms *membership) write(ctx context.Context, base *coordinationv1.Lease, now time.Time) (*coordinationv1.Lease, error) {
	o := ms.s.opts
	leases := ms.s.kube.CoordinationV1().Leases(o.Namespace)
	renew := metav1.NewMicroTime(now)
	seconds := int32(o.held() / time.Second)
	if base == nil {
		got, err := leases.Get(ctx, ms.leaseName(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: ms.leaseName(), Namespace: o.Namespace, Labels: map[string]string{GroupLabel: o.Group}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(ms.s.member), LeaseDurationSeconds: &seconds,
					AcquireTime: &renew, RenewTime: &renew},
			}, metav1.CreateOptions{})
		}
		if err != nil {
			return nil, err
		}
		base = got
	}
	lease := base.DeepCopy()
	lease.Spec.HolderIdentity = ptr.To(ms.s.member)
	lease.Spec.LeaseDurationSeconds = &seconds
	lease.Spec.RenewTime = &renew
	return leases.Update(ctx, lease, metav1.UpdateOptions{})
}

type attempt struct {
	start time.Time
	lease *coordinationv1.Lease
	err   error
}

// renewBy renews the Lease before deadline (on the clock). An attempt not
// answered within a quarter of RenewDeadline gets another beside it, and is not
// given up: a request lost or stuck costs a quarter of the deadline, not the
// membership, and a server that answers every request slowly (seconds, under
// load) is still heard. An attempt that failed is tried again after a tenth of
// RenewEvery. Whichever succeeds first is the renewal; the others end with the
// deadline (or conflict: each writes on the version last read). Returns when the
// successful attempt started (what its Lease says: the others count from when
// they saw it, later), or the last error once the deadline passed or ctx ended.
// ms.lease, the Lease as last written, is this goroutine's: a renewal is one
// Update, and a failure makes the next attempt read it again.
func (ms *membership) renewBy(ctx context.Context, deadline time.Time) (time.Time, error) {
	o := ms.s.opts
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the attempts still in flight
	results := make(chan attempt, 8)
	var last error
	attempts, inFlight := 0, 0
	launch := func() {
		attempts++
		inFlight++
		start, base := ms.s.clock.Now(), ms.lease
		go func() {
			lease, err := ms.write(ctx, base, start)
			results <- attempt{start: start, lease: lease, err: err}
		}()
	}
	end := ms.s.clock.NewTimer(max(deadline.Sub(ms.s.clock.Now()), 0))
	defer end.Stop()
	launch()
	hedge, retry := ms.s.clock.After(o.RenewDeadline/4), (<-chan time.Time)(nil)
	for {
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-end.C():
			if last == nil {
				last = errors.New("no answer")
			}
			return time.Time{}, fmt.Errorf("no renewal within the renew deadline %s (%d attempts, the last error: %w)", o.RenewDeadline, attempts, last)
		case r := <-results:
			inFlight--
			if r.err == nil {
				ms.lease = r.lease
				return r.start, nil
			}
			last, ms.lease = r.err, nil
			ms.s.log.Warn("could not renew the membership Lease; trying again", "error", r.err, "attempt", attempts,
				"deadlineIn", deadline.Sub(ms.s.clock.Now()).Round(time.Millisecond))
			if inFlight == 0 {
				retry, hedge = ms.s.clock.After(o.RenewEvery/10), nil
			}
		case <-hedge:
			ms.s.log.Warn("the membership Lease's renewal has no answer yet; another attempt beside it",
				"waited", (o.RenewDeadline / 4).Round(time.Millisecond), "attempt", attempts+1, "deadlineIn", deadline.Sub(ms.s.clock.Now()).Round(time.Millisecond))
			launch()
			hedge = ms.s.clock.After(o.RenewDeadline / 4)
		case <-retry:
			launch()
			retry, hedge = nil, ms.s.clock.After(o.RenewDeadline/4)
		}
	}
}

// leave deletes this replica's Lease: the coordinator gives its objects to the
// others at once instead of after the lease duration. Called once the work ended.
func (ms *membership) leave() {
	o := ms.s.opts
	ctx, cancel := context.WithTimeout(context.Background(), o.RenewEvery)
	defer cancel()
	err := ms.s.kube.CoordinationV1().Leases(o.Namespace).Delete(ctx, ms.leaseName(), metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		ms.s.log.Warn("could not delete the membership Lease; its objects move to the other replicas when it expires", "error", err)
		return
	}
	ms.s.log.Info("left the shard group: the membership Lease is deleted")
}

// keepRenewed renews every RenewEvery until ctx is done; it calls lost (once) and
// returns when no renewal succeeded for RenewDeadline after the last one started
// (renewBy), at that deadline: the others take its objects a margin later.
func (ms *membership) keepRenewed(ctx context.Context, lastOK time.Time, lost func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ms.s.clock.After(ms.s.opts.RenewEvery):
		}
		ok, err := ms.renewBy(ctx, lastOK.Add(ms.s.opts.RenewDeadline))
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			ms.s.log.Error("could not renew the membership Lease", "error", err, "sinceLastRenewal", ms.s.clock.Since(lastOK).Round(time.Millisecond))
			lost()
			return
		}
		lastOK = ok
	}
}

func errWriteLease(err error, ns string) error {
	return fmt.Errorf("cannot write the membership Lease in namespace %s: %w; give it a namespace that exists (--shard-namespace) and the rights on leases (luaop rbac --shard-across-replicas)", ns, err)
}
