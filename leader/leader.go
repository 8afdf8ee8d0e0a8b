package leader

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// ErrLeadershipLost is returned by Run when the lease could not be renewed: the
// work was stopped, and the process should exit (and be restarted as a standby).
var ErrLeadershipLost = errors.New("leadership lost")

// Defaults of Options.
const (
	DefaultName          = "luaop"
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// serviceAccountNamespace holds the namespace of the Pod the process runs in.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// PodNamespace is the namespace of the Pod the process runs in; false outside a Pod.
// (Leader election and sharding place their Leases there by default.)
func PodNamespace() (string, bool) {
	data, err := os.ReadFile(serviceAccountNamespace)
	ns := strings.TrimSpace(string(data))
	return ns, err == nil && ns != ""
}

// UniqueIdentity is the host name and a random suffix joined by sep: the holder
// identity of a Lease, unique across restarts of a Pod (its name stays).
func UniqueIdentity(sep string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "luaop"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + sep + hex.EncodeToString(b)
}

// Options configure the election. The zero value of every field means its default.
type Options struct {
	// Namespace of the Lease. Defaults to the namespace of the Pod the process runs
	// in (its service account's); outside a Pod it must be given.
	Namespace string
	// Name of the Lease. Defaults to "luaop". Instances with the same Namespace and
	// Name compete; give each operator (each scripts folder) a name of its own.
	Name string
	// Identity of this instance in the Lease (holderIdentity). Defaults to the host
	// name (the Pod name in a Pod), "_", and a random suffix, unique per process.
	Identity string
	// LeaseDuration is how long standbys wait, after the last renewal they saw,
	// before taking the lease over. Defaults to 15s. The Lease stores it in whole
	// seconds, so it must be a whole number of seconds, at least 1s.
	LeaseDuration time.Duration
	// RenewDeadline is how long the leader retries renewing before it gives up the
	// leadership. Defaults to 10s; must be less than LeaseDuration, so that the
	// leader stops before a standby may start.
	RenewDeadline time.Duration
	// RetryPeriod is the interval between tries to acquire or renew. Defaults to
	// 2s; RenewDeadline must exceed 1.2 × RetryPeriod (the jitter of client-go).
	RetryPeriod time.Duration
	// KeepLeaseOnStop does not release the lease when Run's context is cancelled:
	// standbys take over only once it expires, as after a crash. For tests.
	KeepLeaseOnStop bool
	// Logger receives the transitions. Defaults to slog.Default(). client-go's own
	// messages go there too, one level lower (info becomes debug).
	Logger *slog.Logger
}

// withDefaults fills the defaults in and validates.
func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		ns, ok := PodNamespace()
		if !ok {
			return o, errors.New("leader election needs the namespace of its Lease: not running in a Pod, so give it")
		}
		o.Namespace = ns
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Identity == "" {
		o.Identity = UniqueIdentity("_")
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = DefaultRenewDeadline
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = DefaultRetryPeriod
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.LeaseDuration < time.Second || o.LeaseDuration%time.Second != 0:
		return o, fmt.Errorf("lease duration %s: must be a whole number of seconds, at least 1s (the Lease stores seconds)", o.LeaseDuration)
	case o.RenewDeadline <= 0 || o.RetryPeriod <= 0:
		return o, fmt.Errorf("renew deadline %s and retry period %s must be positive", o.RenewDeadline, o.RetryPeriod)
	case o.RenewDeadline >= o.LeaseDuration:
		return o, fmt.Errorf("renew deadline %s must be less than the lease duration %s: the leader must stop before a standby may take over", o.RenewDeadline, o.LeaseDuration)
	case float64(o.RenewDeadline) <= leaderelection.JitterFactor*float64(o.RetryPeriod):
		return o, fmt.Errorf("renew deadline %s must exceed %.1f × the retry period %s", o.RenewDeadline, leaderelection.JitterFactor, o.RetryPeriod)
	}
	return o, nil
}

// Elector takes part in the election of one Lease.
type Elector struct {
	opts    Options
	leases  coordinationv1client.LeasesGetter
	watches coordinationv1client.LeasesGetter // the lease watch: no request timeout
	log     *slog.Logger
	klog    logr.Logger
	leading atomic.Bool
	running atomic.Bool
}

// New validates the options and prepares an Elector; nothing runs until Run. The
// Lease is written through a client of its own (its own rate limit: the
// operator's requests cannot delay the renewals), with a request timeout of
// RenewDeadline.
func New(cfg *rest.Config, opts Options) (*Elector, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "leader-election")
	if cfg.Timeout == 0 || cfg.Timeout > opts.RenewDeadline {
		cfg.Timeout = opts.RenewDeadline
	}
	client, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the lease client: %w", err)
	}
	e := newElector(client, opts)
	// The watch of wakeOnRelease is a long request: the timeout above would cut it.
	watchCfg := rest.CopyConfig(cfg)
	watchCfg.Timeout = 0
	if e.watches, err = coordinationv1client.NewForConfig(watchCfg); err != nil {
		return nil, fmt.Errorf("creating the lease client: %w", err)
	}
	return e, nil
}

func newElector(leases coordinationv1client.LeasesGetter, opts Options) *Elector {
	log := opts.Logger.With("lease", opts.Namespace+"/"+opts.Name, "identity", opts.Identity)
	return &Elector{opts: opts, leases: leases, watches: leases, log: log, klog: logr.FromSlogHandler(quieter{log.Handler()})}
}

// Identity is this instance's holder identity.
func (e *Elector) Identity() string { return e.opts.Identity }

// IsLeader tells whether lead is running (this instance holds the lease).
func (e *Elector) IsLeader() bool { return e.leading.Load() }

// Run validates the options, then runs the election until ctx is done; see
// (*Elector).Run.
func Run(ctx context.Context, cfg *rest.Config, opts Options, lead func(ctx context.Context) error) error {
	e, err := New(cfg, opts)
	if err != nil {
		return err
	}
	return e.Run(ctx, lead)
}

// Run blocks: it waits as a standby until it acquires the lease, then calls lead
// with a context that is cancelled when ctx is done or the leadership is lost;
// lead must return soon after (an operator's Start does). Run returns only after
// lead has returned:
//   - ctx done: the lease, renewed until then, is released (unless
//     KeepLeaseOnStop) and Run returns nil, or what lead returned if it is not a
//     context cancellation;
//   - leadership lost: ErrLeadershipLost (joined with lead's error, if any); exit
//     the process;
//   - lead returned on its own: the lease is released and Run returns what lead
//     returned.
//
// lead is called at most once per Run.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context) error) error {
	if !e.running.CompareAndSwap(false, true) {
		return errors.New("leader: this Elector is already running")
	}
	defer e.running.Store(false)

	lock := &trackingLock{LeaseLock: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: e.opts.Namespace, Name: e.opts.Name},
		Client:     e.leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.opts.Identity},
	}}
	// The election does not end with ctx while leading: the lease stays renewed
	// until lead has returned, so no standby starts while this instance still works.
	electCtx, stopElection := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), e.klog))
	defer stopElection()

	t := &term{e: e, ctx: ctx, lead: lead, stopElection: stopElection, leadDone: make(chan struct{})}
	stopWatch := context.AfterFunc(ctx, t.stopping)
	defer stopWatch()

	e.log.Debug("joining the election", "leaseDuration", e.opts.LeaseDuration, "renewDeadline", e.opts.RenewDeadline, "retryPeriod", e.opts.RetryPeriod)
	if err := e.campaign(electCtx, lock, e.electionConfig(lock, t)); err != nil {
		return err
	}
	// An acquired lease means OnStartedLeading was started (it may not have run
	// yet): wait for lead.
	if lock.acquired.Load() {
		<-t.leadDone
	}
	leadErr, ended := t.finish()
	return e.outcome(ctx, lock, leadErr, ended)
}

// term is one Run's part in the election: what client-go's callbacks, ctx's end
// and Run's return share.
type term struct {
	e            *Elector
	ctx          context.Context // Run's
	lead         func(ctx context.Context) error
	stopElection func()
	leadDone     chan struct{} // closed when OnStartedLeading returns

	mu          sync.Mutex // leaf: guards the fields below
	stopped     bool       // ctx is done
	started     bool       // OnStartedLeading ran
	finished    bool       // Run is returning: no more logs
	leadErr     error
	endedItself bool // lead returned while leading, with ctx not done
}

// stopping is called when ctx is done: a standby just leaves; a leader goes on
// renewing until lead has returned.
func (t *term) stopping() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if !t.started {
		t.stopElection()
	}
}

// startedLeading runs lead (client-go's OnStartedLeading): with a context that ends
// with leaderCtx (the leadership) or ctx; the election ends when it returns.
func (t *term) startedLeading(leaderCtx context.Context) {
	defer close(t.leadDone)
	defer t.stopElection()
	t.mu.Lock()
	t.started = true
	stop := t.stopped
	t.mu.Unlock()
	if stop {
		return // acquired just as ctx was cancelled: nothing to lead
	}
	workCtx, cancel := context.WithCancel(leaderCtx)
	defer cancel()
	unwatch := context.AfterFunc(t.ctx, cancel)
	defer unwatch()
	t.e.leading.Store(true)
	t.e.log.Info("became leader")
	err := t.lead(workCtx)
	t.e.leading.Store(false)
	t.mu.Lock()
	t.leadErr = err
	t.endedItself = leaderCtx.Err() == nil && t.ctx.Err() == nil
	t.mu.Unlock()
}

// newLeader logs who holds the lease (client-go's OnNewLeader).
func (t *term) newLeader(identity string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.finished || identity == t.e.opts.Identity:
	case identity == "":
		t.e.log.Debug("the lease is free")
	case t.started:
		t.e.log.Warn("the lease is now held by "+identity, "leader", identity)
	default:
		t.e.log.Info("standing by; leader is "+identity, "leader", identity)
	}
}

// finish ends the term's logs and returns lead's outcome.
func (t *term) finish() (leadErr error, endedItself bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished = true
	return t.leadErr, t.endedItself
}

// electionConfig is client-go's election on lock, with t's callbacks.
func (e *Elector) electionConfig(lock *trackingLock, t *term) leaderelection.LeaderElectionConfig {
	return leaderelection.LeaderElectionConfig{
		Lock:          lock,
		Name:          e.opts.Name,
		LeaseDuration: e.opts.LeaseDuration,
		RenewDeadline: e.opts.RenewDeadline,
		RetryPeriod:   e.opts.RetryPeriod,
		// Released by Run, once lead has returned: client-go would release it as
		// soon as the renewals stop, while lead may still be finishing its work.
		ReleaseOnCancel: false,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: t.startedLeading,
			OnStoppedLeading: func() {},
			OnNewLeader:      t.newLeader,
		},
	}
}

// campaign runs the election in rounds until electCtx is done or a round acquired
// the lease (and then lost it, or lead returned). A round is client-go's election,
// called off (before this instance writes itself into the lease, never after:
// roundGate) when the lease is seen released, and followed at once by a new
// round, whose first try is immediate.
func (e *Elector) campaign(electCtx context.Context, lock *trackingLock, config leaderelection.LeaderElectionConfig) error {
	for {
		roundCtx, endRound := context.WithCancel(electCtx)
		gate := &roundGate{}
		lock.gate.Store(gate)
		unwatch := e.wakeOnRelease(roundCtx, func() {
			if gate.callOff() {
				e.log.Debug("the lease was released: trying to take it at once")
				endRound()
			}
		})
		elector, err := leaderelection.NewLeaderElector(config)
		if err != nil {
			unwatch()
			endRound()
			return err
		}
		elector.Run(roundCtx)
		unwatch()
		endRound()
		if lock.acquired.Load() || electCtx.Err() != nil || !gate.calledOff() {
			return nil
		}
	}
}

// outcome is what Run returns once the election is over and lead returned (err:
// what lead returned; ended: it returned on its own), after releasing the lease
// where that is due.
func (e *Elector) outcome(ctx context.Context, lock *trackingLock, err error, ended bool) error {
	switch {
	case !lock.acquired.Load():
		e.log.Info("left the election without leading")
		return nil
	case ended || ctx.Err() != nil:
		if e.opts.KeepLeaseOnStop {
			e.log.Info("stopped leading; the lease is kept until it expires")
		} else {
			e.release(lock.LeaseLock)
		}
		if ended || (err != nil && !errors.Is(err, context.Canceled)) {
			return err
		}
		return nil
	default:
		e.log.Error("leadership lost: the lease could not be renewed; stopped leading")
		if err != nil && !errors.Is(err, context.Canceled) {
			return errors.Join(ErrLeadershipLost, err)
		}
		return ErrLeadershipLost
	}
}

// release gives the lease up if this instance still holds it, so that a standby
// takes over at its next try instead of after LeaseDuration. The election has
// ended: nothing else uses the lock.
func (e *Elector) release(lock *resourcelock.LeaseLock) {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.RenewDeadline)
	defer cancel()
	for range 3 {
		rec, _, err := lock.Get(ctx)
		if err != nil {
			e.log.Warn("could not release the lease; standbys take over when it expires", "error", err)
			return
		}
		if rec.HolderIdentity != e.opts.Identity {
			e.log.Info("stopped leading; the lease is held by another instance", "leader", rec.HolderIdentity)
			return
		}
		now := metav1.NewTime(time.Now())
		err = lock.Update(ctx, resourcelock.LeaderElectionRecord{
			LeaderTransitions:    rec.LeaderTransitions,
			LeaseDurationSeconds: 1,
			RenewTime:            now,
			AcquireTime:          now,
		})
		if err == nil {
			e.log.Info("stopped leading; released the lease")
			return
		}
		if !apierrors.IsConflict(err) {
			e.log.Warn("could not release the lease; standbys take over when it expires", "error", err)
			return
		}
	}
	e.log.Warn("could not release the lease (conflicts); standbys take over when it expires")
}

// wakeOnRelease watches the Lease until ctx is done, and calls released when a
// change empties its holder (a stopping leader releases it so). A release before
// the watch began is not seen: client-go's next retry takes the lease then. Without
// the permission to watch leases (luaop rbac --leader-elect grants it), the watch
// ends quietly and the retries alone take over. stop ends the watch and waits for it.
func (e *Elector) wakeOnRelease(ctx context.Context, released func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		leases := e.watches.Leases(e.opts.Namespace)
		for ctx.Err() == nil {
			w, err := leases.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + e.opts.Name})
			if err != nil {
				if apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err) {
					e.log.Debug("cannot watch the lease: after a release, a standby takes it at its next retry", "error", err)
					return
				}
				select {
				case <-ctx.Done():
				case <-time.After(e.opts.RetryPeriod):
				}
				continue
			}
			followReleases(ctx, w, released)
		}
	}()
	return func() { cancel(); <-done }
}

// followReleases reads a watch of the Lease until it ends or ctx is done, and
// calls released on each change from a holder to none; the first event is the
// state the changes start from.
func followReleases(ctx context.Context, w watch.Interface, released func()) {
	defer w.Stop()
	held, seen := false, false
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			lease, isLease := ev.Object.(*coordinationv1.Lease)
			if !isLease || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			holds := lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != ""
			if seen && held && !holds {
				released()
			}
			held, seen = holds, true
		}
	}
}

// roundGate orders, within one round, this instance's first write of itself into
// the lease and the round being called off: whichever comes first wins, so a
// called-off round never holds the lease, and a round that holds it is never
// called off.
type roundGate struct{ state atomic.Int32 }

const (
	gateOpen      int32 = iota // nothing written yet
	gateWriting                // the first write is in flight
	gateCalledOff              // the round ends without writing
	gateHeld                   // written: the round leads until it loses the lease
)

// beginWrite reports whether a write with this instance as holder may go ahead.
func (g *roundGate) beginWrite() bool {
	return g.state.Load() == gateHeld || g.state.CompareAndSwap(gateOpen, gateWriting)
}

// endWrite records a write's outcome: held on success, open again after a failed
// first write (a failed renewal leaves it held).
func (g *roundGate) endWrite(ok bool) {
	if ok {
		g.state.Store(gateHeld)
		return
	}
	g.state.CompareAndSwap(gateWriting, gateOpen)
}

// callOff ends the round if it has written nothing (and is not writing).
func (g *roundGate) callOff() bool { return g.state.CompareAndSwap(gateOpen, gateCalledOff) }

func (g *roundGate) calledOff() bool { return g.state.Load() == gateCalledOff }

// errRoundCalledOff refuses a round's write after the round was called off.
var errRoundCalledOff = errors.New("the lease was released: this round of the election is called off for a new one")

// trackingLock tells whether the lease was acquired: client-go writes the lease
// with this instance as holder only in a successful acquisition or renewal, and
// starts OnStartedLeading right after the first one. Those writes go through the
// round's gate.
type trackingLock struct {
	*resourcelock.LeaseLock
	acquired atomic.Bool
	gate     atomic.Pointer[roundGate]
}

func (l *trackingLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(r, func() error { return l.LeaseLock.Create(ctx, r) })
}

func (l *trackingLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.write(r, func() error { return l.LeaseLock.Update(ctx, r) })
}

func (l *trackingLock) write(r resourcelock.LeaderElectionRecord, write func() error) error {
	if r.HolderIdentity != l.Identity() {
		return write() // not this instance's: a release
	}
	gate := l.gate.Load()
	if gate != nil && !gate.beginWrite() {
		return errRoundCalledOff
	}
	err := write()
	if gate != nil {
		gate.endWrite(err == nil)
	}
	if err == nil {
		l.acquired.Store(true)
	}
	return err
}

// quieter lowers client-go's messages one level: its info (attempting to acquire,
// acquired) is debug here, its errors (a conflict while competing for a free
// lease, a failed renewal that is retried) warnings; the transitions that matter
// are logged by Run.
type quieter struct{ h slog.Handler }

func lower(l slog.Level) slog.Level {
	switch {
	case l >= slog.LevelError:
		return slog.LevelWarn
	case l >= slog.LevelWarn:
		return l
	default:
		return l - 4
	}
}

func (q quieter) Enabled(ctx context.Context, l slog.Level) bool { return q.h.Enabled(ctx, lower(l)) }
func (q quieter) Handle(ctx context.Context, r slog.Record) error {
	r.Level = lower(r.Level)
	return q.h.Handle(ctx, r)
}
func (q quieter) WithAttrs(a []slog.Attr) slog.Handler { return quieter{q.h.WithAttrs(a)} }
func (q quieter) WithGroup(n string) slog.Handler      { return quieter{q.h.WithGroup(n)} }
