package sharding

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/luaop/luaop/leader"
	"github.com/luaop/luaop/state"
)

// GroupLabel labels the membership Leases with their group (luaop release looks
// for live members by it).
const GroupLabel = "luaop.dev/shard-group"

// Defaults of Options.
const (
	DefaultGroup         = "luaop"
	DefaultLeaseDuration = 15 * time.Second
	DefaultPrefix        = "luaop.dev"
)

// Options configure sharding. The zero value of every field means its default.
type Options struct {
	// Namespace of the membership and coordinator Leases. Defaults to the
	// namespace of the Pod the process runs in; outside a Pod it must be given.
	Namespace string
	// Group names the replicas that share the objects: those of one Group (in one
	// Namespace) split them. Defaults to "luaop"; one per operator (scripts folder).
	Group string
	// Identity names this replica. Defaults to the host name (the Pod name) and a
	// random suffix, unique per process. It is written (made a valid label value
	// of at most 63 characters) as the value of the shard label on its objects.
	Identity string
	// Prefix of the shard label (<prefix>/shard) and of the handover annotation
	// (<prefix>/shard-handover): the operator's --prefix. Defaults to luaop.dev.
	Prefix string
	// LeaseDuration bounds the time from a replica's death to its objects being
	// handled by the others. Of it, the membership Lease holds RenewDeadline and a
	// margin (held: its leaseDurationSeconds, after which the others take its
	// objects, since it stopped itself at RenewDeadline); the rest is the move's:
	// the coordinator's pass and writes and the new owner's first handling. Whole
	// seconds, at least 2s. Defaults to 15s.
	LeaseDuration time.Duration
	// RenewEvery is how often the membership Lease is renewed. Defaults to a fifth
	// of LeaseDuration: until RenewDeadline, a renewal has the rest for attempts.
	RenewEvery time.Duration
	// RenewDeadline: a replica that could not renew for this long stops handling
	// (Run returns ErrMembershipLost) before the others may take its objects.
	// Defaults to three fifths of LeaseDuration (the Lease then holds about two thirds of
	// it, leaving a third for the move); must be less than it.
	RenewDeadline time.Duration
	// VirtualNodes per member on the hash ring. Defaults to DefaultVirtualNodes.
	VirtualNodes int
	// Tolerance bounds how far each member's share may be from the fair one
	// (Plan). Defaults to DefaultTolerance (8 %).
	Tolerance float64
	// Workers are the goroutines handing objects over (each replica). Defaults
	// to 8.
	Workers int
	// AssignWorkers are the coordinator's goroutines writing assignments: each
	// write waits for the API server's answer, so a burst of new objects is
	// labelled at AssignWorkers / (the write's round trip) per second (8 gave
	// about 50 per second on a loaded 2-core API server, below what one replica
	// handles). Defaults to 32.
	AssignWorkers int
	// Debounce is how long the coordinator gathers changes before a pass over the
	// objects. Defaults to 50ms: new objects are assigned well within a second.
	Debounce time.Duration
	// Observer, when set, is told about ownership and handovers (metrics).
	Observer Observer
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock defaults to the real clock (tests give a fake one).
	Clock clock.WithTicker
}

// Observer is told about sharding (metrics.Metrics implements it). Its methods
// are called from sharding's goroutines and must return quickly.
type Observer interface {
	// ShardOwned is how many objects this replica handles now, of members live.
	ShardOwned(objects, members int)
	// ShardHandover counts one object handed over: "marked" by the coordinator,
	// "released" by this replica, "reassigned" from a member gone.
	ShardHandover(kind string)
	// ShardRebalanced is the time from a change of the members to every object at
	// its member (coordinator only).
	ShardRebalanced(d time.Duration)
}

// Releaser is the processing side (processing.Reactor implements it).
type Releaser interface {
	// Release finishes the object's cycle in flight, stops its daemons and timers,
	// forgets it, and returns then.
	Release(ctx context.Context, resource schema.GroupVersionResource, namespace, name string) error
	// Revisit offers every watched object of resource to Admits again.
	Revisit(resource schema.GroupVersionResource)
}

// Elector runs lead while this replica is the coordinator (leader.Elector).
type Elector interface {
	Run(ctx context.Context, lead func(ctx context.Context) error) error
}

// Clients are what Sharding talks to the API server with. New builds them; tests
// give client-go's fakes.
type Clients struct {
	Kube     kubernetes.Interface // Leases, access reviews
	Metadata metadata.Interface   // the coordinator's watches, labels and handovers
	// Elector elects the coordinator; nil: this replica always coordinates
	// (tests of one replica).
	Elector Elector
}

// Sharding is one replica's part in a group of replicas sharing the objects. It
// implements processing.Shard (member.go) and runs the coordinator while elected
// (coordinator.go).
type Sharding struct {
	opts    Options
	kube    kubernetes.Interface
	meta    metadata.Interface
	elector Elector
	clock   clock.WithTicker
	log     *slog.Logger
	// member is the Identity as a label value: this replica's name in the group.
	member   string
	label    string // <prefix>/shard
	handover string // <prefix>/shard-handover
	ms       *membership

	rel atomic.Pointer[releaserBox]

	// mu is a leaf lock: it guards the fields below, copied or swapped only.
	mu        sync.Mutex
	resources map[schema.GroupVersionResource]*resourceShare
	owned     map[objRef]struct{}
	draining  map[objRef]struct{}
	members   []string
	ring      *Ring // of members, for the resources filtered after the watch
	// changes pokes whoever follows the resources and the members (buffered 1).
	resourcesChanged chan struct{}
	membersChanged   chan struct{}
	// coordinatorWake pokes the coordinator: resources, members, objects changed.
	coordinatorWake chan struct{}

	coordinating atomic.Bool
	released     atomic.Int64
	// lost is closed when the membership is lost, before work's context ends: the
	// Reactor then stops at once, with no grace (StopWritingAtOnce).
	lost     chan struct{}
	lostOnce sync.Once
	drains   workqueue.TypedRateLimitingInterface[drainItem]
}

type releaserBox struct{ r Releaser }

// resourceShare is how one watched resource is split.
type resourceShare struct {
	gvr        schema.GroupVersionResource
	namespaces []string
	// labels and fields are the handlers' server-side selectors: the objects to
	// share out.
	labels, fields string
	// filtered: luaop may not label its objects (no patch right): every replica
	// watches all of them and handles those the ring gives it.
	filtered bool
}

// objRef names one object of one resource.
type objRef struct {
	gvr       schema.GroupVersionResource
	namespace string
	name      string
}

func (r objRef) key() string { return ObjectKey(r.gvr.Group, r.gvr.Resource, r.namespace, r.name) }

func (r objRef) String() string {
	if r.namespace == "" {
		return r.gvr.Resource + " " + r.name
	}
	return r.gvr.Resource + " " + r.namespace + "/" + r.name
}

func (o Options) withDefaults() (Options, error) {
	if o.Namespace == "" {
		ns, ok := leader.PodNamespace()
		if !ok {
			return o, errors.New("sharding needs the namespace of its Leases: not running in a Pod, so give it (--shard-namespace)")
		}
		o.Namespace = ns
	}
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.Identity == "" {
		o.Identity = leader.UniqueIdentity("-") // part of a Lease's name: no "_"
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.LeaseDuration < 2*time.Second || o.LeaseDuration%time.Second != 0 {
		return o, fmt.Errorf("shard lease duration %s: must be a whole number of seconds, at least 2s (the Lease stores seconds)", o.LeaseDuration)
	}
	if o.RenewEvery <= 0 {
		o.RenewEvery = o.LeaseDuration / 5
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = o.LeaseDuration * 3 / 5
	}
	if o.RenewDeadline >= o.LeaseDuration || o.RenewEvery >= o.RenewDeadline {
		return o, fmt.Errorf("shard renewals every %s with a deadline of %s: the deadline must exceed the interval and be less than the lease duration %s", o.RenewEvery, o.RenewDeadline, o.LeaseDuration)
	}
	if o.held() > o.LeaseDuration {
		return o, fmt.Errorf("shard renewals with a deadline of %s: the membership Lease would hold %s, longer than the lease duration %s; shorten the deadline", o.RenewDeadline, o.held(), o.LeaseDuration)
	}
	if o.VirtualNodes <= 0 {
		o.VirtualNodes = DefaultVirtualNodes
	}
	if o.Tolerance <= 0 || o.Tolerance >= 1 {
		o.Tolerance = DefaultTolerance
	}
	if o.Workers <= 0 {
		o.Workers = 8
	}
	if o.AssignWorkers <= 0 {
		o.AssignWorkers = 32
	}
	if o.Debounce <= 0 {
		o.Debounce = 50 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return o, nil
}

// held is how long this replica's membership Lease holds after a renewal (its
// leaseDurationSeconds, whole seconds): its RenewDeadline, when it stops handling
// by itself, and a quarter of RenewEvery for its requests then in flight. The
// others take its objects once held has passed since they saw the renewal.
func (o Options) held() time.Duration {
	return (o.RenewDeadline + o.RenewEvery/4 + time.Second - 1).Truncate(time.Second)
}

// New prepares sharding from a rest.Config: its own clients, with their own rate
// limit and their own connections (so the operator's requests cannot delay
// renewals and assignments), and a coordinator elected on the Lease
// <group>-coordinator with the leader package.
func New(cfg *rest.Config, opts Options) (*Sharding, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg = rest.AddUserAgent(rest.CopyConfig(cfg), "sharding")
	if cfg.QPS == 0 {
		cfg.QPS, cfg.Burst = 100, 200 // a burst of new objects is labelled at once
	}
	ownConnections(cfg)
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the sharding clients: %w", err)
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the sharding clients: %w", err)
	}
	// The coordinator's Lease holds as long as a member's: a killed coordinator's
	// objects (it is a member too) wait for a new coordinator no longer than for
	// their member's Lease, and standbys try every third of RenewEvery.
	elector, err := leader.New(cfg, leader.Options{Namespace: opts.Namespace, Name: opts.Group + "-coordinator",
		Identity: opts.Identity, LeaseDuration: opts.held(), RenewDeadline: opts.RenewDeadline, RetryPeriod: opts.RenewEvery / 3,
		Logger: opts.Logger.With("role", "shard coordinator election")})
	if err != nil {
		return nil, fmt.Errorf("the coordinator election: %w", err)
	}
	return NewWithClients(Clients{Kube: kube, Metadata: meta, Elector: elector}, opts)
}

// ownConnections gives every client made from cfg a transport of its own (and so
// its own HTTP/2 connection): client-go shares one transport, and one connection,
// among the clients of configurations alike, and this one's Lease renewals would
// otherwise queue with the handlers' requests and the watches of the operator.
// A configuration with a dial function is never shared (its key is the function's
// holder, made anew for each client).
func ownConnections(cfg *rest.Config) {
	if cfg.Dial != nil || cfg.Transport != nil {
		return // the caller's own already
	}
	cfg.Dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
}

// NewWithClients prepares sharding on the given clients; nothing runs until Run.
func NewWithClients(c Clients, opts Options) (*Sharding, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Sharding{
		opts: opts, kube: c.Kube, meta: c.Metadata, elector: c.Elector, clock: opts.Clock,
		member:    memberName(opts.Identity),
		label:     state.ShardLabel(opts.Prefix),
		handover:  opts.Prefix + "/shard-handover",
		resources: map[schema.GroupVersionResource]*resourceShare{},
		owned:     map[objRef]struct{}{},
		draining:  map[objRef]struct{}{},
		ring:      NewRing(nil, opts.VirtualNodes),

		resourcesChanged: make(chan struct{}, 1),
		membersChanged:   make(chan struct{}, 1),
		coordinatorWake:  make(chan struct{}, 1),
		lost:             make(chan struct{}),
	}
	s.log = opts.Logger.With("shardGroup", opts.Group, "member", s.member)
	s.ms = &membership{s: s, seen: map[string]observedLease{}, changed: func() { poke(s.membersChanged); poke(s.coordinatorWake) }}
	return s, nil
}

// Attach gives sharding the Reactor whose objects it hands over; before Run.
func (s *Sharding) Attach(r Releaser) { s.rel.Store(&releaserBox{r}) }

func (s *Sharding) releaser() Releaser {
	if b := s.rel.Load(); b != nil {
		return b.r
	}
	return nil
}

// Member is this replica's name in the group (the value of the shard label).
func (s *Sharding) Member() string { return s.member }

// StopWritingAtOnce is closed when this replica lost its membership: its Lease
// holds only a margin past the renew deadline, so the cycles and daemons in flight
// must be cancelled then, not given the shutdown grace period (processing's
// Options.StopAtOnce). What they had not written, the next owner does again.
func (s *Sharding) StopWritingAtOnce() <-chan struct{} { return s.lost }

// Selector is the label selector of this replica's objects.
func (s *Sharding) Selector() string { return s.label + "=" + s.member }

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// memberName makes an identity a valid label value and Lease name part: lower
// case letters, digits and '-', at most 40 characters (a hash of the identity
// replaces what is cut or changed).
func memberName(identity string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(identity) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if name == identity && len(name) <= 40 {
		return name
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(identity))
	sum := fmt.Sprintf("%08x", h.Sum32())
	if len(name) > 31 {
		name = strings.TrimRight(name[:31], "-")
	}
	if name == "" {
		return "m" + sum
	}
	return name + "-" + sum
}

// Run joins the group and runs work while this replica is a member: it writes
// the membership Lease (an error when it cannot), keeps it renewed, hands over
// the objects the coordinator moves away, and coordinates while elected. work's
// context ends with ctx or when the membership is lost; once work has returned
// (the Reactor's cycles and daemons ended), the Lease is deleted, so the
// coordinator gives this replica's objects to the others at once. Returns
// ErrMembershipLost when the Lease could not be renewed, else what work returned.
func (s *Sharding) Run(ctx context.Context, work func(ctx context.Context) error) error {
	infCtx, stopInformer := context.WithCancel(ctx)
	defer stopInformer()
	inf := s.ms.informer()
	go inf.RunWithContext(infCtx)
	lastOK, err := s.ms.renewBy(ctx, s.clock.Now().Add(s.opts.RenewDeadline))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return errWriteLease(err, s.opts.Namespace)
	}
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	s.log.Info("joined the shard group", "lease", s.opts.Namespace+"/"+s.ms.leaseName(), "labelSelector", s.Selector(),
		"leaseDuration", s.opts.LeaseDuration)

	workCtx, cancelWork := context.WithCancel(ctx)
	defer cancelWork()
	var lost atomic.Bool
	var bg sync.WaitGroup
	renewCtx, stopRenewing := context.WithCancel(context.WithoutCancel(ctx))
	bg.Add(1)
	go func() {
		defer bg.Done()
		s.ms.keepRenewed(renewCtx, lastOK, func() {
			lost.Store(true)
			s.log.Error("the membership Lease could not be renewed: stopping handling at once, before the others take these objects over")
			s.lostOnce.Do(func() { close(s.lost) }) // first: the Reactor must not take its grace period
			cancelWork()
		})
	}()

	s.drains = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[drainItem](100*time.Millisecond, 10*time.Second),
		workqueue.TypedRateLimitingQueueConfig[drainItem]{})
	for range s.opts.Workers {
		bg.Add(1)
		go func() {
			defer bg.Done()
			for s.handOverNext(workCtx) {
			}
		}()
	}
	bg.Add(1)
	go func() { defer bg.Done(); s.followMembers(workCtx) }()
	bg.Add(1)
	go func() { defer bg.Done(); s.coordinateWhileElected(workCtx) }()

	err = work(workCtx)
	cancelWork()
	s.drains.ShutDown()
	stopRenewing()
	bg.Wait()
	if lost.Load() {
		return ErrMembershipLost
	}
	s.ms.leave()
	return err
}

// coordinateWhileElected takes part in the coordinator election until ctx ends;
// a coordinator that lost its lease stands by again.
func (s *Sharding) coordinateWhileElected(ctx context.Context) {
	lead := func(ctx context.Context) error {
		c := newCoordinator(s)
		s.coordinating.Store(true)
		defer s.coordinating.Store(false)
		s.log.Info("coordinating the shard group")
		c.run(ctx)
		return nil
	}
	if s.elector == nil {
		_ = lead(ctx)
		return
	}
	for ctx.Err() == nil {
		if err := s.elector.Run(ctx, lead); err != nil && ctx.Err() == nil {
			s.log.Warn("no longer the shard coordinator; standing by", "error", err)
			select {
			case <-ctx.Done():
			case <-s.clock.After(s.opts.RenewEvery):
			}
		}
	}
}

// State is what /debug and `luaop status` show.
type State struct {
	Group       string          `json:"group"`
	Namespace   string          `json:"namespace"`
	Member      string          `json:"member"`
	Selector    string          `json:"labelSelector"`
	Members     []string        `json:"members"`
	Coordinator bool            `json:"coordinator"`
	Owned       int             `json:"owned"`
	Draining    int             `json:"draining"`
	Released    int64           `json:"handedOver"`
	Resources   []ResourceState `json:"resources"`
}

// ResourceState tells how one watched resource is split.
type ResourceState struct {
	Resource string `json:"resource"`
	// Mode: "label selector" (the watch holds only this replica's objects) or
	// "filtered after the watch" (luaop may not label them).
	Mode string `json:"mode"`
}

// State is a snapshot.
func (s *Sharding) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := State{Group: s.opts.Group, Namespace: s.opts.Namespace, Member: s.member, Selector: s.Selector(),
		Members: slices.Clone(s.members), Coordinator: s.coordinating.Load(), Owned: len(s.owned), Draining: len(s.draining),
		Released: s.released.Load()}
	for _, r := range s.resources {
		mode := "label selector"
		if r.filtered {
			mode = "filtered after the watch"
		}
		st.Resources = append(st.Resources, ResourceState{Resource: r.gvr.GroupResource().String(), Mode: mode})
	}
	slices.SortFunc(st.Resources, func(a, b ResourceState) int { return strings.Compare(a.Resource, b.Resource) })
	return st
}
