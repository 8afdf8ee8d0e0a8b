package processing

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/processing/causes"
)

// ReadDeclarations is the optional capability of Handlers to list the resources the
// scripts declared they read (luaop.reads): the Reactor keeps their views in the
// informer cache (in the operator's namespaces), where the scripts' reads find
// them, and readiness waits for their first list. It must not block.
type ReadDeclarations interface {
	Reads() []causes.Read
}

// readViews are the views held for the declared reads, by declaration.
//
// Ownership: mu (a leaf lock) guards the maps; Refresh changes them, resolvers of
// resources not served yet (goroutines under resources.running) add to held.
type readViews struct {
	mu      sync.Mutex
	wanted  map[readKey]bool
	pending map[readKey]bool // wanted, not held yet (resolving)
	held    map[readKey][]*caching.Handle
}

type readKey struct {
	resource causes.Resource // as spelled
	labels   string
	metadata bool
}

// refreshReads holds the views of the reads the scripts declare now and releases
// those of the reads they no longer declare.
func (o *Reactor) refreshReads(ctx context.Context) {
	var declared []causes.Read
	if rd, ok := o.handlers.(ReadDeclarations); ok {
		declared = rd.Reads()
	}
	r := &o.reads
	r.mu.Lock()
	if r.wanted == nil {
		r.wanted, r.pending, r.held = map[readKey]bool{}, map[readKey]bool{}, map[readKey][]*caching.Handle{}
	}
	clear(r.wanted)
	var start []causes.Read
	for _, d := range declared {
		k := readKey{resource: d.Resource, labels: d.LabelSelector, metadata: d.Metadata}
		if r.wanted[k] {
			continue
		}
		r.wanted[k] = true
		if r.held[k] == nil && !r.pending[k] {
			r.pending[k] = true
			start = append(start, d)
		}
	}
	var drop [][]*caching.Handle
	for k, handles := range r.held {
		if !r.wanted[k] {
			drop = append(drop, handles)
			delete(r.held, k)
		}
	}
	r.mu.Unlock()
	for _, handles := range drop {
		for _, h := range handles {
			h.Release()
		}
	}
	for _, d := range start {
		o.startRead(ctx, d)
	}
}

// startRead resolves a declared read and holds its views, at once when the
// resource is served, else in the background once it is.
func (o *Reactor) startRead(ctx context.Context, d causes.Read) {
	if info, err := lookupResource(o.disco, d.Resource); err == nil {
		o.holdRead(ctx, d, info)
		return
	}
	o.res.mu.Lock()
	if o.res.closed {
		o.res.mu.Unlock()
		return
	}
	o.res.running.Add(1)
	o.res.mu.Unlock()
	go func() {
		defer o.res.running.Done()
		if info, err := o.discover(ctx, d.Resource); err == nil {
			o.holdRead(ctx, d, info)
		}
	}()
}

// holdRead holds the views of a resolved read, one per namespace the operator
// serves, unless the scripts stopped declaring it meanwhile.
func (o *Reactor) holdRead(ctx context.Context, d causes.Read, info *resourceInfo) {
	k := readKey{resource: d.Resource, labels: d.LabelSelector, metadata: d.Metadata}
	namespaces := []string{metav1.NamespaceAll}
	if exact := o.filter.exactNamespaces(); info.namespaced && exact != nil {
		namespaces = exact
	}
	var handles []*caching.Handle
	for _, ns := range namespaces {
		v := caching.View{Resource: info.gvr, Namespace: ns, LabelSelector: d.LabelSelector, MetadataOnly: d.Metadata}
		h, err := o.cache.Acquire(ctx, v, true)
		if err != nil {
			o.log.Error("cannot keep a declared read in the cache; luaop.kube reads it from the API server", "at", d.Source, "view", v.String(), "error", err)
			continue
		}
		handles = append(handles, h)
	}
	r := &o.reads
	r.mu.Lock()
	wanted := r.wanted[k] && r.pending[k]
	if wanted {
		delete(r.pending, k)
		r.held[k] = handles
	}
	r.mu.Unlock()
	if !wanted {
		for _, h := range handles {
			h.Release()
		}
		return
	}
	o.log.Info("keeping a declared read in the cache", "resource", causes.Resource{GroupVersionResource: info.gvr}.String(),
		"labelSelector", d.LabelSelector, "metadataOnly", d.Metadata, "namespaces", namespacesForLog(namespaces), "at", d.Source)
}

// readsSynced tells whether every declared read is held and listed.
func (o *Reactor) readsSynced() bool {
	r := &o.reads
	r.mu.Lock()
	if len(r.pending) > 0 {
		r.mu.Unlock()
		return false
	}
	var handles []*caching.Handle
	for _, hs := range r.held {
		handles = append(handles, hs...)
	}
	r.mu.Unlock()
	for _, h := range handles {
		if !h.Informer().HasSynced() {
			return false
		}
	}
	return true
}
