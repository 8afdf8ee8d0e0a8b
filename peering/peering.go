package peering

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Priorities of luaop's commands (kopf's: `kopf run --dev` is 666).
const (
	DevPriority = 666
	RunPriority = 0
)

// Defaults of Options.
const (
	DefaultNamespace     = "luaop-system"
	DefaultLeaseDuration = 15 * time.Second
)

// The Lease's label and annotations.
const (
	PrefixLabel          = "peering.luaop.dev/prefix"
	priorityAnnotation   = "peering.luaop.dev/priority"
	resourcesAnnotation  = "peering.luaop.dev/resources"
	namespacesAnnotation = "peering.luaop.dev/namespaces"
	modeAnnotation       = "peering.luaop.dev/mode"
	hostAnnotation       = "peering.luaop.dev/host"
	pausedAnnotation     = "peering.luaop.dev/paused"
	prefixAnnotation     = "peering.luaop.dev/prefix"
)

// Worker is the work peering pauses and resumes (processing.Reactor, through the
// operator). Pause stops new work at once and returns once the work in flight has
// ended, or promptly once ctx ends (peering calls off a pause that way, and waits
// for that return before it calls Resume, so that the calls take effect in their
// order); Resume lets it work again. The Worker starts paused: Run
// resumes it once it knows that no peer blocks it.
type Worker interface {
	Pause(ctx context.Context, reason string) error
	Resume()
}

// Options configure a Peering. The zero value of every field means its default.
type Options struct {
	// Namespace of the Leases; every operator that should coordinate must use the
	// same one. Defaults to DefaultNamespace (the namespace of deploy/).
	Namespace string
	// Prefix is the operator's --prefix: only operators of one prefix coordinate.
	Prefix string
	// Identity names this operator among its peers. Defaults to user@host/random.
	Identity string
	// Mode ("dev", "run") and Priority: see the package doc.
	Mode     string
	Priority int
	// LeaseDuration is how long after its last renewal an operator counts as alive
	// (whole seconds, at least 1s). Defaults to 15s.
	LeaseDuration time.Duration
	// RenewEvery is how often the Lease is renewed. Defaults to LeaseDuration/3.
	RenewEvery time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to the real clock (tests give a fake one).
	Clock clock.WithTicker
	// OnChange, when set, is called from Run's goroutine, with no lock held, after
	// the State changed. It must return quickly.
	OnChange func(State)
}

// State is what peering knows now (/debug, the metrics, the dev view).
type State struct {
	Namespace string `json:"namespace"`
	Lease     string `json:"lease"`
	Identity  string `json:"identity"`
	Priority  int    `json:"priority"`
	// Alone: this operator could not write its Lease (AloneReason says why) and
	// works without peering, trying again every RenewEvery.
	Alone       bool   `json:"alone,omitempty"`
	AloneReason string `json:"aloneReason,omitempty"`
	// Paused: this operator does not work now; Reason says why.
	Paused bool   `json:"paused"`
	Reason string `json:"reason,omitempty"`
	// Peers are the live peers that serve some of the same resources.
	Peers []Peer `json:"peers"`
}

// Peering runs the protocol of the package for one operator.
type Peering struct {
	opts   Options
	client kubernetes.Interface
	worker Worker
	log    *slog.Logger
	clock  clock.WithTicker
	lease  string
	host   string

	scope   atomic.Pointer[Scope]
	state   atomic.Pointer[State]
	trigger chan struct{}
	running atomic.Bool
}

// New prepares peering for an operator serving scope; nothing runs until Run.
func New(client kubernetes.Interface, worker Worker, scope Scope, opts Options) (*Peering, error) {
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.Prefix == "" {
		return nil, errors.New("peering: the operator's prefix is required")
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	if opts.LeaseDuration < time.Second || opts.LeaseDuration%time.Second != 0 {
		return nil, fmt.Errorf("peering lease duration %s: must be a whole number of seconds, at least 1s (the Lease stores seconds)", opts.LeaseDuration)
	}
	if opts.RenewEvery <= 0 {
		opts.RenewEvery = opts.LeaseDuration / 3
	}
	if opts.RenewEvery >= opts.LeaseDuration {
		return nil, fmt.Errorf("peering renewal period %s must be less than the lease duration %s", opts.RenewEvery, opts.LeaseDuration)
	}
	host, _ := os.Hostname()
	if opts.Identity == "" {
		opts.Identity = defaultIdentity(host)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	p := &Peering{opts: opts, client: client, worker: worker, clock: opts.Clock, host: host,
		lease: LeaseName(opts.Prefix, opts.Identity), trigger: make(chan struct{}, 1),
		log: opts.Logger.With("peering", opts.Namespace+"/"+LeaseName(opts.Prefix, opts.Identity))}
	sc := normalized(scope)
	p.scope.Store(&sc)
	p.state.Store(&State{Namespace: opts.Namespace, Lease: p.lease, Identity: opts.Identity, Priority: opts.Priority,
		Paused: true, Reason: "looking for peers", Peers: []Peer{}})
	return p, nil
}

func defaultIdentity(host string) string {
	name := "luaop"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if host == "" {
		host = "unknown"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return name + "@" + host + "/" + hex.EncodeToString(b)
}

// LeaseName is the name of the Lease of an operator of prefix with identity.
func LeaseName(prefix, identity string) string {
	sum := sha256.Sum256([]byte(identity))
	suffix := "-peer-" + hex.EncodeToString(sum[:5])
	if len(prefix)+len(suffix) > 253 {
		prefix = strings.TrimRight(prefix[:253-len(suffix)], ".-")
	}
	return prefix + suffix
}

// prefixLabelValue is the label value of a prefix: itself when it fits a label
// value (63 characters), else a hash.
func prefixLabelValue(prefix string) string {
	if len(prefix) <= 63 {
		return prefix
	}
	sum := sha256.Sum256([]byte(prefix))
	return hex.EncodeToString(sum[:16])
}

func normalized(s Scope) Scope {
	out := Scope{Resources: slices.Compact(slices.Sorted(slices.Values(s.Resources))),
		Namespaces: slices.Compact(slices.Sorted(slices.Values(s.Namespaces)))}
	return out
}

// SetScope changes what the operator serves (after a reload): the Lease says so at
// once and the decision is taken again.
func (p *Peering) SetScope(s Scope) {
	s = normalized(s)
	if old := p.scope.Load(); old != nil && slices.Equal(old.Resources, s.Resources) && slices.Equal(old.Namespaces, s.Namespaces) {
		return
	}
	p.scope.Store(&s)
	p.wake()
}

// State is a copy of what peering knows now.
func (p *Peering) State() State {
	st := *p.state.Load()
	st.Peers = slices.Clone(st.Peers)
	return st
}

func (p *Peering) wake() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// loop is Run's state, owned by its goroutine.
type loop struct {
	*Peering
	lister   coordinationlisters.LeaseNamespaceLister
	observed map[string]observation
	// own is the operator's Lease as last written (nil: not written yet).
	own *coordinationv1.Lease
	// wantPaused: the decision is to pause; pausedAck: the Worker's Pause returned
	// for the current pause (published as the paused annotation).
	wantPaused, pausedAck bool
	pauseGen              int
	// stopPause calls off the pause under way (nil: none); pauseDone is closed
	// when its goroutine has ended (cancelPause).
	stopPause    context.CancelFunc
	pauseDone    chan struct{}
	reason       string
	drained      chan int
	waitingSince time.Time
	lastWarning  string
	alone        string
	peers        []Peer
	// listing: the informer of the Leases runs (started after the first write);
	// synced tells whether it has listed them; unlisted says why it has not (the
	// operator then works alone too).
	listing  bool
	synced   func() bool
	unlisted string
}

type observation struct {
	renew string
	at    time.Time
}

// Run takes part in peering until ctx is done, then deletes the operator's Lease
// (stop the operator's work first: peers start as soon as the Lease is gone). The
// Worker must be paused when Run starts. Run returns nil.
func (p *Peering) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return errors.New("peering: already running")
	}
	l := &loop{Peering: p, observed: map[string]observation{}, wantPaused: true, pausedAck: true,
		reason: "looking for peers", drained: make(chan int, 1)}
	defer l.leave()

	factory := informers.NewSharedInformerFactoryWithOptions(p.client, 0, informers.WithNamespace(p.opts.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{PrefixLabel: prefixLabelValue(p.opts.Prefix)}.String()
		}))
	informer := factory.Coordination().V1().Leases()
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.wake() },
		UpdateFunc: func(any, any) { p.wake() },
		DeleteFunc: func(any) { p.wake() },
	})
	l.lister = informer.Lister().Leases(p.opts.Namespace)
	l.synced = informer.Informer().HasSynced
	informerCtx, stopInformer := context.WithCancel(ctx)
	defer stopInformer()

	renew := p.clock.NewTicker(p.opts.RenewEvery)
	defer renew.Stop()
	var recheck clock.Timer
	var recheckC <-chan time.Time
	defer func() {
		if recheck != nil {
			recheck.Stop()
		}
	}()
	renewDue := true
	for {
		if renewDue || (l.own != nil && l.annotationsChanged()) {
			if l.write(ctx) && !l.listing {
				// Listed only once the Lease could be written: with no RBAC for Leases
				// (or no namespace) there is nothing to watch, and client-go would log
				// its failed lists over and over.
				l.listing = true
				factory.Start(informerCtx.Done())
				syncCtx, cancel := context.WithTimeout(ctx, p.opts.LeaseDuration)
				cache.WaitForCacheSync(syncCtx.Done(), informer.Informer().HasSynced)
				cancel()
			}
		}
		renewDue = false
		next := l.evaluate(ctx)
		if recheck != nil {
			recheck.Stop()
			recheck, recheckC = nil, nil
		}
		if !next.IsZero() {
			recheck = p.clock.NewTimer(next.Sub(p.clock.Now()))
			recheckC = recheck.C()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-p.trigger: // a Lease or the scope changed
		case <-renew.C():
			renewDue = true
		case <-recheckC: // a blocking peer's lease expires, or the wait for lower peers ends
		case gen := <-l.drained:
			if gen == l.pauseGen && l.wantPaused && !l.pausedAck {
				l.pausedAck = true // the Lease says so at the top of the loop
				l.log.Info("paused: the work in flight has ended", "reason", l.reason)
			}
		}
	}
}

// annotationsChanged tells whether the Lease as written says something else than
// it should now (the scope, the paused state).
func (l *loop) annotationsChanged() bool {
	want := l.desired(l.clock.Now()).Annotations
	for k, v := range want {
		if l.own.Annotations[k] != v {
			return true
		}
	}
	return false
}

// desired is the operator's Lease as it should be now.
func (l *loop) desired(now time.Time) *coordinationv1.Lease {
	sc := l.scope.Load()
	secs := int32(l.opts.LeaseDuration / time.Second)
	renew := metav1.NewMicroTime(now)
	identity := l.opts.Identity
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.lease, Namespace: l.opts.Namespace,
			Labels: map[string]string{PrefixLabel: prefixLabelValue(l.opts.Prefix), "app.kubernetes.io/managed-by": "luaop"},
			Annotations: map[string]string{
				priorityAnnotation:   strconv.Itoa(l.opts.Priority),
				resourcesAnnotation:  strings.Join(sc.Resources, ","),
				namespacesAnnotation: strings.Join(sc.Namespaces, ","),
				modeAnnotation:       l.opts.Mode,
				hostAnnotation:       l.host,
				pausedAnnotation:     strconv.FormatBool(l.wantPaused && l.pausedAck),
				prefixAnnotation:     l.opts.Prefix,
			}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &identity, LeaseDurationSeconds: &secs, RenewTime: &renew},
	}
	if l.own != nil {
		lease.ResourceVersion = l.own.ResourceVersion
		lease.Spec.AcquireTime = l.own.Spec.AcquireTime
	} else {
		lease.Spec.AcquireTime = &renew
	}
	return lease
}

// write creates or renews the operator's Lease; false when it cannot be written
// (the operator then works alone, and says why once).
func (l *loop) write(ctx context.Context) bool {
	api := l.client.CoordinationV1().Leases(l.opts.Namespace)
	wctx, cancel := context.WithTimeout(ctx, l.opts.RenewEvery)
	defer cancel()
	var err error
	var out *coordinationv1.Lease
	for attempt := 0; attempt < 3; attempt++ {
		want := l.desired(l.clock.Now())
		if l.own == nil {
			out, err = api.Create(wctx, want, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				// A Lease of this identity left by an earlier process of it (a dev
				// restarted under the same --peering-identity): it is this operator's.
				if cur, gerr := api.Get(wctx, l.lease, metav1.GetOptions{}); gerr == nil {
					l.own = cur
					continue
				}
			}
		} else {
			out, err = api.Update(wctx, want, metav1.UpdateOptions{})
			if apierrors.IsNotFound(err) { // deleted by someone: write it again
				l.own = nil
				continue
			}
			if apierrors.IsConflict(err) {
				if cur, gerr := api.Get(wctx, l.lease, metav1.GetOptions{}); gerr == nil {
					l.own = cur
					continue
				}
			}
		}
		break
	}
	if err == nil {
		l.own = out
		if l.alone != "" {
			l.log.Info("peering works: this operator coordinates with the others of its prefix", "namespace", l.opts.Namespace)
			l.alone = ""
		}
		return true
	}
	why := ""
	switch {
	case apierrors.IsNotFound(err):
		why = "namespace " + l.opts.Namespace + " does not exist: no deployed operator to coordinate with there"
	case apierrors.IsForbidden(err):
		why = fmt.Sprintf("the operator may not write Leases in namespace %s (%v): grant get, list, watch, create, update and delete of leases there (luaop rbac), or give --standalone", l.opts.Namespace, err)
	default:
		// A failure that says nothing about peering (the API server busy, the
		// network): the decision stands, the next renewal tries again.
		l.log.Warn("peering: writing this operator's Lease failed; tried again at the next renewal", "error", err)
		return false
	}
	l.own = nil
	if why != l.alone {
		level := slog.LevelWarn
		if apierrors.IsNotFound(err) {
			level = slog.LevelInfo
		}
		l.log.Log(ctx, level, "peering: working alone; tried again every "+l.opts.RenewEvery.String(), "why", why)
	}
	l.alone = why
	return false
}

// evaluate reads the peers, decides, acts (pause, resume), and returns when to
// decide again without any Lease changing (zero: only on a change).
func (l *loop) evaluate(ctx context.Context) time.Time {
	now := l.clock.Now()
	self := Self{Identity: l.opts.Identity, Priority: l.opts.Priority, Scope: *l.scope.Load(), WaitForLower: l.opts.LeaseDuration}
	var d Decision
	if l.alone == "" && !l.listing {
		// Not looked yet (the first write failed for a passing reason): stay as is.
		l.publish()
		return time.Time{}
	}
	unlisted := ""
	if l.alone == "" && !l.synced() {
		unlisted = "the Leases of namespace " + l.opts.Namespace + " cannot be listed (grant list and watch of leases there, luaop rbac)"
	}
	if unlisted != l.unlisted && unlisted != "" {
		l.log.Warn("peering: working alone; "+unlisted, "namespace", l.opts.Namespace)
	}
	l.unlisted = unlisted
	if l.alone == "" && l.unlisted == "" {
		peers := l.readPeers(now)
		d = Decide(self, peers, now, l.waitingSince)
		if len(d.Unconfirmed) > 0 && len(d.Higher) == 0 && len(d.Same) == 0 {
			if l.waitingSince.IsZero() {
				l.waitingSince = now
			}
		} else {
			l.waitingSince = time.Time{}
		}
		if d.Warning != "" && d.Warning != l.lastWarning {
			l.log.Warn(d.Warning)
		}
		l.lastWarning = d.Warning
		l.cleanDead(ctx, d.Dead)
	}
	switch {
	case d.Pause && !l.wantPaused:
		l.pause(ctx, d.Reason)
		l.log.Info("pausing: "+d.Reason, "priority", l.opts.Priority)
	case d.Pause && d.Reason != l.reason:
		l.pause(ctx, d.Reason)
	case !d.Pause && l.wantPaused:
		// Say so on the Lease before working: a higher-priority operator arriving
		// meanwhile must not read "paused" from this one while it works. When that
		// write fails for a passing reason, stay paused (the pause under way goes
		// on): the next renewal writes and decides again.
		wasAck := l.pausedAck
		l.wantPaused, l.pausedAck, l.reason = false, false, ""
		if l.alone == "" && !l.write(ctx) && l.alone == "" {
			l.wantPaused, l.pausedAck = true, wasAck
			l.reason = "about to work, once this operator's Lease says so (writing it failed; tried again every " + l.opts.RenewEvery.String() + ")"
			l.peers = append(append(append([]Peer{}, d.Higher...), d.Same...), d.Lower...)
			l.publish()
			return d.Recheck
		}
		l.cancelPause()
		// What /debug, the view and the metric show says "working" before the
		// Worker works, as it says "paused" before the Worker has paused: whoever
		// sees the Worker work reads the same from the state.
		l.peers = append(append(append([]Peer{}, d.Higher...), d.Same...), d.Lower...)
		l.publish()
		l.worker.Resume()
		switch {
		case l.alone != "" || l.unlisted != "":
			l.log.Debug("working alone: no peering")
		case len(d.Lower) > 0:
			l.log.Info("working; paused in favour of this operator: " + names(d.Lower))
		default:
			l.log.Info("working: no other operator of this prefix serves the same resources")
		}
	}
	l.peers = append(append(append([]Peer{}, d.Higher...), d.Same...), d.Lower...)
	l.publish()
	return d.Recheck
}

// pause asks the Worker to pause, on a goroutine of its own: its end is reported
// on drained, and the Lease then says "paused".
func (l *loop) pause(ctx context.Context, reason string) {
	l.cancelPause()
	if !l.wantPaused {
		l.pausedAck = false
	}
	l.wantPaused, l.reason = true, reason
	l.pauseGen++
	gen := l.pauseGen
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	l.stopPause, l.pauseDone = cancel, done
	worker, drained := l.worker, l.drained
	go func() {
		defer close(done)
		if err := worker.Pause(pctx, reason); err != nil {
			return // resumed or stopped meanwhile
		}
		select {
		case drained <- gen:
		default:
			// An older pause's report is waiting: replace it.
			select {
			case <-drained:
			default:
			}
			select {
			case drained <- gen:
			default:
			}
		}
	}()
}

// cancelPause calls off the pause under way, if any, and waits for its goroutine to
// end, so that the Worker's calls keep the loop's order: a Pause that had not yet
// taken effect (its goroutine scheduled late) would otherwise take effect after
// the Resume that follows, leaving the Worker paused, handling nothing, while the
// Lease, /debug and the view say it works. Worker.Pause returns promptly once its
// context ends, so this wait is short.
func (l *loop) cancelPause() {
	if l.stopPause == nil {
		return
	}
	l.stopPause()
	<-l.pauseDone
	l.stopPause, l.pauseDone = nil, nil
}

// readPeers parses the Leases of the prefix, tracking when each was seen renewed.
func (l *loop) readPeers(now time.Time) []Peer {
	leases, err := l.lister.List(labels.Everything())
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	var out []Peer
	for _, lease := range leases {
		if lease.Name == l.lease {
			continue
		}
		p, renewed, ok := parseLease(lease)
		if !ok || lease.Annotations[prefixAnnotation] != l.opts.Prefix {
			continue
		}
		seen[lease.Name] = true
		key := renewed.String() + "|" + lease.ResourceVersion
		obs, known := l.observed[lease.Name]
		switch {
		case !known:
			at := now
			if !renewed.IsZero() && renewed.Before(now) {
				at = renewed
			}
			obs = observation{renew: key, at: at}
		case obs.renew != key:
			obs = observation{renew: key, at: now}
		}
		l.observed[lease.Name] = obs
		p.ObservedAt = obs.at
		p.Expires = obs.at.Add(p.LeaseDuration)
		out = append(out, p)
	}
	for name := range l.observed {
		if !seen[name] {
			delete(l.observed, name)
		}
	}
	return out
}

// parseLease reads a peer from its Lease; false for a Lease that is not one.
func parseLease(lease *coordinationv1.Lease) (Peer, time.Time, bool) {
	a := lease.Annotations
	prio, err := strconv.Atoi(a[priorityAnnotation])
	if err != nil || lease.Spec.HolderIdentity == nil || lease.Spec.LeaseDurationSeconds == nil {
		return Peer{}, time.Time{}, false
	}
	var renewed time.Time
	if lease.Spec.RenewTime != nil {
		renewed = lease.Spec.RenewTime.Time
	}
	split := func(s string) []string {
		if s == "" {
			return nil
		}
		return strings.Split(s, ",")
	}
	return Peer{Identity: *lease.Spec.HolderIdentity, Priority: prio, Mode: a[modeAnnotation], Host: a[hostAnnotation],
		Scope:  Scope{Resources: split(a[resourcesAnnotation]), Namespaces: split(a[namespacesAnnotation])},
		Paused: a[pausedAnnotation] == "true", Lease: lease.Name,
		LeaseDuration: time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second}, renewed, true
}

// cleanDead deletes the Leases of peers gone for more than a lease duration (kopf's
// autoclean), unless they were renewed meanwhile (a precondition on the version).
func (l *loop) cleanDead(ctx context.Context, dead []Peer) {
	for _, p := range dead {
		lease, err := l.lister.Get(p.Lease)
		if err != nil {
			continue
		}
		rv := lease.ResourceVersion
		dctx, cancel := context.WithTimeout(ctx, l.opts.RenewEvery)
		err = l.client.CoordinationV1().Leases(l.opts.Namespace).Delete(dctx, p.Lease,
			metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
		cancel()
		if err == nil {
			l.log.Info("removed the Lease of a peer that is gone", "peer", p.String(), "lease", p.Lease)
		}
	}
}

// publish stores the State and tells OnChange when it changed.
func (l *loop) publish() {
	why := l.alone
	if why == "" {
		why = l.unlisted
	}
	st := &State{Namespace: l.opts.Namespace, Lease: l.lease, Identity: l.opts.Identity, Priority: l.opts.Priority,
		Alone: why != "", AloneReason: why, Paused: l.wantPaused, Reason: l.reason, Peers: slices.Clone(l.peers)}
	if st.Peers == nil {
		st.Peers = []Peer{}
	}
	old := l.state.Swap(st)
	if l.opts.OnChange != nil && !sameState(old, st) {
		l.opts.OnChange(*st)
	}
}

func sameState(a, b *State) bool {
	if a == nil || a.Paused != b.Paused || a.Reason != b.Reason || a.Alone != b.Alone || a.AloneReason != b.AloneReason || len(a.Peers) != len(b.Peers) {
		return false
	}
	for i := range a.Peers {
		if a.Peers[i].Identity != b.Peers[i].Identity || a.Peers[i].Paused != b.Peers[i].Paused {
			return false
		}
	}
	return true
}

// leave deletes the operator's Lease (a clean exit: peers resume at once).
func (l *loop) leave() {
	l.cancelPause()
	defer l.running.Store(false)
	if l.own == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.opts.RenewEvery)
	defer cancel()
	rv := l.own.ResourceVersion
	err := l.client.CoordinationV1().Leases(l.opts.Namespace).Delete(ctx, l.lease, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		l.log.Warn("could not delete this operator's Lease; peers resume when it expires", "error", err, "resourceVersion", rv)
		return
	}
	l.log.Info("left peering: this operator's Lease is deleted")
}
