package processing

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/luaop/luaop/processing/causes"
)

// resources resolves the resources as the scripts spell them ("v1/cm", "v1/configmaps",
// "v1/ConfigMap") to what the server serves, once per spelling, and runs one watcher
// per canonical resource however many spellings point at it.
//
// Ownership: mu (a leaf lock) guards the maps; watchers and resolvers run in
// goroutines of their own, started by refresh and waited for by wait.
type resources struct {
	mu       sync.Mutex
	aliases  map[causes.Resource]causes.Resource // spelling -> canonical, once resolved
	pending  map[causes.Resource]bool            // spellings being resolved
	watchers map[causes.Resource]*watcher        // by canonical resource
	version  int                                 // bumped at every new alias
	closed   bool                                // set by close: nothing new starts
	running  sync.WaitGroup                      // Add only under mu, and only while !closed
}

// close stops new resolvers and watchers from starting, so that waiting for running
// never races with a reload adding to it.
func (r *resources) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

func newResources() *resources {
	return &resources{aliases: map[causes.Resource]causes.Resource{}, pending: map[causes.Resource]bool{},
		watchers: map[causes.Resource]*watcher{}}
}

// refreshResources resolves the spellings not seen before. All of them are resolved
// in one pass before any new watcher starts, so that the first notification of a
// resource already finds every handler registered for it, however spelled. Spellings
// the server does not serve yet (a CRD installed later) are retried in the background.
func (o *Reactor) refreshResources(ctx context.Context, specs []causes.Spec) {
	var fresh []causes.Resource
	o.res.mu.Lock()
	if o.res.closed {
		o.res.mu.Unlock()
		return
	}
	for _, s := range specs {
		if _, ok := o.res.aliases[s.Resource]; ok || o.res.pending[s.Resource] {
			continue
		}
		o.res.pending[s.Resource] = true
		fresh = append(fresh, s.Resource)
	}
	o.res.mu.Unlock()
	resolved := map[causes.Resource]*resourceInfo{}
	var missing []causes.Resource
	for _, spelling := range fresh {
		if info, err := lookupResource(o.disco, spelling); err == nil {
			o.settleStorage(ctx, info)
			resolved[spelling] = info
		} else {
			missing = append(missing, spelling)
		}
	}
	start := o.bind(resolved)
	o.res.mu.Lock()
	if o.res.closed {
		o.res.mu.Unlock()
		return
	}
	o.res.running.Add(len(start) + len(missing))
	o.res.mu.Unlock()
	for _, w := range start {
		go func() {
			defer o.res.running.Done()
			w.run(ctx)
		}()
	}
	for _, spelling := range missing {
		go func() {
			defer o.res.running.Done()
			o.resolveAndWatch(ctx, spelling)
		}()
	}
}

// settleStorage chooses where a resolved resource's bookkeeping goes, and says so.
func (o *Reactor) settleStorage(ctx context.Context, info *resourceInfo) {
	s := o.chooseStorage(ctx, info)
	info.store.Store(s)
	o.log.Info("storage chosen", "resource", causes.Resource{GroupVersionResource: info.gvr}.String(), "storage", s.where(), "reason", s.reason)
}

// bind records resolved spellings and returns the watchers to start (one per
// canonical resource not watched yet).
func (o *Reactor) bind(resolved map[causes.Resource]*resourceInfo) []*watcher {
	var start []*watcher
	var late []causes.Resource
	o.res.mu.Lock()
	for spelling, info := range resolved {
		canonical := causes.Resource{GroupVersionResource: info.gvr}
		delete(o.res.pending, spelling)
		o.res.aliases[spelling] = canonical
		o.res.version++
		if w := o.res.watchers[canonical]; w == nil {
			w = newWatcher(o, canonical, info)
			o.res.watchers[canonical] = w
			start = append(start, w)
		} else {
			late = append(late, canonical)
		}
	}
	o.res.mu.Unlock()
	for spelling, info := range resolved {
		if canonical := (causes.Resource{GroupVersionResource: info.gvr}); spelling != canonical {
			o.log.Debug("resource resolved", "as written", spelling.String(), "resource", canonical.String())
		}
	}
	if len(late) > 0 {
		// A spelling resolved after its resource was watched: its objects get a
		// cycle with the handlers now complete.
		for _, key := range o.objects.keys() {
			if slices.Contains(late, key.resource) {
				o.queue.Add(key)
			}
		}
	}
	return start
}

// resolveAndWatch resolves one spelling, waiting while the resource does not exist,
// then watches its canonical resource unless another spelling already does.
func (o *Reactor) resolveAndWatch(ctx context.Context, spelling causes.Resource) {
	info, err := o.discover(ctx, spelling)
	if err != nil {
		return // ctx cancelled
	}
	o.settleStorage(ctx, info)
	for _, w := range o.bind(map[causes.Resource]*resourceInfo{spelling: info}) {
		w.run(ctx)
	}
}

// discover resolves a spelling on the server, retrying every 2 s until it exists.
func (o *Reactor) discover(ctx context.Context, spelling causes.Resource) (*resourceInfo, error) {
	warned := false
	for {
		info, err := lookupResource(o.disco, spelling)
		if err == nil {
			if warned {
				o.log.Info("resource appeared on the server", "resource", spelling.String())
			}
			return info, nil
		}
		if !warned {
			o.log.Warn("waiting for the resource to exist on the server; is its CRD installed? (kubectl get crd)",
				"resource", spelling.String(), "reason", err)
			warned = true
		}
		t := o.clock.NewTimer(2 * time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C():
		}
	}
}

// watchersSnapshot returns the watchers and whether every spelling is resolved.
func (o *Reactor) watchersSnapshot() ([]*watcher, bool) {
	o.res.mu.Lock()
	defer o.res.mu.Unlock()
	out := make([]*watcher, 0, len(o.res.watchers))
	for _, w := range o.res.watchers {
		out = append(out, w)
	}
	return out, len(o.res.pending) == 0
}

// allResolved tells whether every resource the handlers name is resolved (and so
// has its watcher).
func (o *Reactor) allResolved(specs []causes.Spec) bool {
	o.res.mu.Lock()
	defer o.res.mu.Unlock()
	for _, s := range specs {
		if _, ok := o.res.aliases[s.Resource]; !ok {
			return false
		}
	}
	return true
}

func (o *Reactor) watcherOf(r causes.Resource) *watcher {
	o.res.mu.Lock()
	defer o.res.mu.Unlock()
	return o.res.watchers[r]
}

func (o *Reactor) resourceInfo(r causes.Resource) *resourceInfo {
	if w := o.watcherOf(r); w != nil {
		return w.info
	}
	return nil
}

// specIndex is the current handler set grouped by canonical resource, so that
// neither a watch notification nor a cycle scans every handler.
type specIndex struct {
	source     []causes.Spec // the Handlers.Specs() slice it was built from
	version    int           // resources.version it was built with
	byResource map[causes.Resource][]causes.Spec
	kinds      map[causes.Resource]map[causes.Kind]bool
}

type specIndexCache struct {
	current atomic.Pointer[specIndex]
}

// specs returns the index of the current handler set, rebuilding it after a reload
// or a newly resolved resource. Concurrent rebuilds are harmless: same result.
func (o *Reactor) specs() *specIndex {
	source := o.handlers.Specs()
	o.res.mu.Lock()
	version := o.res.version
	idx := o.specIdx.current.Load()
	if idx != nil && idx.version == version && sameSlice(idx.source, source) {
		o.res.mu.Unlock()
		return idx
	}
	aliases := make(map[causes.Resource]causes.Resource, len(o.res.aliases))
	for k, v := range o.res.aliases {
		aliases[k] = v
	}
	o.res.mu.Unlock()
	idx = &specIndex{source: source, version: version, byResource: map[causes.Resource][]causes.Spec{},
		kinds: map[causes.Resource]map[causes.Kind]bool{}}
	for _, s := range source {
		canonical, ok := aliases[s.Resource]
		if !ok {
			continue // not resolved yet: its objects are not watched yet either
		}
		idx.byResource[canonical] = append(idx.byResource[canonical], s)
		if idx.kinds[canonical] == nil {
			idx.kinds[canonical] = map[causes.Kind]bool{}
		}
		idx.kinds[canonical][s.Kind] = true
	}
	// Every index of the scripts exists from their load on, empty until its objects
	// are indexed (kopf's, and luaop test's): a handler of another resource reading
	// one before any of its objects went through a cycle (created together, or none
	// yet) sees no entry, not an "index not registered" error and a retry.
	for _, s := range source {
		if s.Kind == causes.KindIndex {
			o.indexes.Declare(s.ID)
		}
	}
	o.specIdx.current.Store(idx)
	return idx
}

func (x *specIndex) has(r causes.Resource, k causes.Kind) bool { return x.kinds[r][k] }

func sameSlice(a, b []causes.Spec) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}

// ResolvedResource is a resource as the operator resolves it from a script's spelling.
type ResolvedResource struct {
	GVR               schema.GroupVersionResource
	Kind              string
	Namespaced        bool
	StatusSubresource bool
}

// ErrResourceNotServed is wrapped by ResolveResource's error when discovery
// answered that the group/version or the resource is not served; any other error
// (the server or the network failing) says nothing about the resource.
var ErrResourceNotServed = errors.New("resource not served")

// notServed is the message of a resource discovery says is not served; it is
// ErrResourceNotServed for errors.Is.
type notServed struct{ msg string }

func (e notServed) Error() string        { return e.msg }
func (e notServed) Is(target error) bool { return target == ErrResourceNotServed }

// ResolveResource resolves a resource as scripts spell it (plural, singular, kind or
// short name) through discovery, as the operator does before watching it.
func ResolveResource(disco discovery.DiscoveryInterface, spelling causes.Resource) (ResolvedResource, error) {
	info, err := lookupResource(disco, spelling)
	if err != nil {
		return ResolvedResource{}, err
	}
	return ResolvedResource{GVR: info.gvr, Kind: info.kind, Namespaced: info.namespaced, StatusSubresource: info.statusSubresource}, nil
}
