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
// group. Liveness is judged by the time this replica saw a renewal, not by the
// peer's clock (as client-go's leader election does), except for a Lease seen for
// the first time, judged by its renewTime.
type membership struct {
	s *Sharding

	mu sync.Mutex // leaf lock: guards seen
	// seen: lease name -> what was observed of it.
	seen map[string]observedLease

	changed func() // told (no lock held) when a Lease came, went or was renewed late
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
			// First seen: judged by its own renewTime (it may be long dead).
			ms.seen[lease.Name] = observedLease{member: member, renewTime: renew, observedAt: renew, duration: d}
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

// renew writes this replica's Lease (creating it when missing) with a fresh
// renewTime, within timeout.
func (ms *membership) renew(ctx context.Context, timeout time.Duration) error {
	o := ms.s.opts
	leases := ms.s.kube.CoordinationV1().Leases(o.Namespace)
	now := metav1.NewMicroTime(ms.s.clock.Now())
	seconds := int32(o.LeaseDuration / time.Second)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lease, err := leases.Get(ctx, ms.leaseName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: ms.leaseName(), Namespace: o.Namespace, Labels: map[string]string{GroupLabel: o.Group}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(ms.s.member), LeaseDurationSeconds: &seconds,
				AcquireTime: &now, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.HolderIdentity = ptr.To(ms.s.member)
	lease.Spec.LeaseDurationSeconds = &seconds
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
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
// returns when no renewal succeeded for RenewDeadline. A renewal may take all the
// time left until that deadline (a slow API server is not a lost membership), and a
// failed one is tried again after a tenth of RenewEvery.
func (ms *membership) keepRenewed(ctx context.Context, lastOK time.Time, lost func()) {
	o := ms.s.opts
	wait := o.RenewEvery
	for {
		select {
		case <-ctx.Done():
			return
		case <-ms.s.clock.After(wait):
		}
		left := o.RenewDeadline - ms.s.clock.Since(lastOK)
		if left <= 0 {
			lost()
			return
		}
		start := ms.s.clock.Now() // what the Lease says: the others count from there, or later
		err := ms.renew(ctx, left)
		if err == nil {
			lastOK, wait = start, o.RenewEvery
			continue
		}
		if ctx.Err() != nil {
			return
		}
		since := ms.s.clock.Since(lastOK)
		ms.s.log.Warn("could not renew the membership Lease", "error", err, "sinceLastRenewal", since.Round(time.Millisecond), "deadline", o.RenewDeadline)
		if since >= o.RenewDeadline {
			lost()
			return
		}
		wait = o.RenewEvery / 10
	}
}

func errWriteLease(err error, ns string) error {
	return fmt.Errorf("cannot write the membership Lease in namespace %s: %w; give it a namespace that exists (--shard-namespace) and the rights on leases (luaop rbac --shard-across-replicas)", ns, err)
}
