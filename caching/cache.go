package caching

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// View is what one informer holds: the objects of one resource in one namespace (""
// for every namespace, and for cluster-scoped resources) that the API server selects
// by label and field selectors, whole or as metadata only (PartialObjectMetadata).
type View struct {
	Resource      schema.GroupVersionResource
	Namespace     string
	LabelSelector string
	FieldSelector string
	MetadataOnly  bool
}

func (v View) String() string {
	var b strings.Builder
	b.WriteString(v.Resource.Resource)
	if v.Resource.Group != "" {
		b.WriteString("." + v.Resource.Group)
	}
	if v.Namespace != "" {
		b.WriteString(" in " + v.Namespace)
	}
	if v.LabelSelector != "" {
		b.WriteString(" labelled " + v.LabelSelector)
	}
	if v.FieldSelector != "" {
		b.WriteString(" with " + v.FieldSelector)
	}
	if v.MetadataOnly {
		b.WriteString(" (metadata only)")
	}
	return b.String()
}

// Options configure a Cache. The zero value of every field means its default.
type Options struct {
	// ResyncPeriod is the informers' resync period. Defaults to 0: none.
	ResyncPeriod time.Duration
	// ReadYourWritesTimeout bounds how long a read waits for the cache to hold a
	// write announced with Wrote; past it the read answers what the cache holds,
	// and says so in the log. Defaults to 5s (the processing core's consistency
	// timeout).
	ReadYourWritesTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Clock drives the read-your-writes deadline. Defaults to the real clock.
	Clock clock.WithTicker
}

// Cache is the operator's informer cache: one shared informer per View, started by
// the first Acquire of the view and stopped when its last Handle is released (or the
// context of that first Acquire ends). Views that a holder lets serve reads answer
// Get and List. Who owns what is in doc.go.
type Cache struct {
	dynamic  dynamic.Interface
	metadata metadata.Interface
	opts     Options
	log      *slog.Logger

	mu    sync.Mutex // leaf: guards views and each view's holders and servers, saidPartial
	views map[View]*view
	// saidPartial are the partial reads already said (partial): resource,
	// namespace and get or list with its selector.
	saidPartial map[string]bool
	running     sync.WaitGroup
}

// New makes a cache on the given clients (metadata may be nil: no metadata-only
// views then). Nothing runs until a view is acquired.
func New(dyn dynamic.Interface, meta metadata.Interface, opts Options) *Cache {
	if opts.ReadYourWritesTimeout <= 0 {
		opts.ReadYourWritesTimeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Cache{dynamic: dyn, metadata: meta, opts: opts, log: opts.Logger, views: map[View]*view{}, saidPartial: map[string]bool{}}
}

// view is one running informer and what the cache keeps beside it.
type view struct {
	key      View
	informer cache.SharedIndexInformer
	labels   labels.Selector
	fields   fields.Selector // nil: no field selector
	cancel   context.CancelFunc
	// holders and servers count the handles, and those letting the view serve
	// reads (under Cache.mu).
	holders, servers int

	mu sync.Mutex // leaf: guards indexed and expect
	// indexed are the label keys the store has an index of (added on the first
	// list that selects by them).
	indexed map[string]bool
	// expect are the writes the view must show before a read of it (expect.go).
	expect map[string]*expectation
}

// Handle is one holder's hold of a view; Release ends it.
type Handle struct {
	c      *Cache
	v      *view
	serves bool
	once   sync.Once
}

// Informer is the view's informer: add event handlers to it (and remove them before
// Release). It runs already.
func (h *Handle) Informer() cache.SharedIndexInformer { return h.v.informer }

// View is what the handle holds.
func (h *Handle) View() View { return h.v.key }

// Release ends the hold; the view's informer stops with its last holder.
func (h *Handle) Release() {
	h.once.Do(func() {
		c := h.c
		c.mu.Lock()
		h.v.holders--
		if h.serves {
			h.v.servers--
		}
		last := h.v.holders == 0
		if last && c.views[h.v.key] == h.v {
			delete(c.views, h.v.key)
		}
		c.mu.Unlock()
		if last {
			h.v.cancel()
		}
	})
}

// Acquire holds view v, starting its informer (under ctx) if no one holds it yet.
// serveReads lets Get and List answer from it while this handle is held: a holder
// whose view is not the whole truth of what it selects (a replica's share of
// sharded objects) passes false.
func (c *Cache) Acquire(ctx context.Context, v View, serveReads bool) (*Handle, error) {
	c.mu.Lock()
	vw := c.views[v]
	if vw != nil {
		vw.holders++
		if serveReads {
			vw.servers++
		}
		c.mu.Unlock()
		return &Handle{c: c, v: vw, serves: serveReads}, nil
	}
	c.mu.Unlock()
	built, err := c.newView(v)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	built.cancel = cancel
	c.mu.Lock()
	if vw = c.views[v]; vw == nil { // else another Acquire made it meanwhile: ours never ran
		vw = built
		c.views[v] = vw
		c.running.Add(1)
		go c.run(runCtx, vw)
	} else {
		cancel()
	}
	vw.holders++
	if serveReads {
		vw.servers++
	}
	c.mu.Unlock()
	return &Handle{c: c, v: vw, serves: serveReads}, nil
}

// newView builds the informer of v (nothing runs yet).
func (c *Cache) newView(v View) (*view, error) {
	sel, err := labels.Parse(v.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("the label selector of %s: %w", v, err)
	}
	vw := &view{key: v, labels: sel, indexed: map[string]bool{}, expect: map[string]*expectation{}}
	if v.FieldSelector != "" {
		if vw.fields, err = fields.ParseSelector(v.FieldSelector); err != nil {
			return nil, fmt.Errorf("the field selector of %s: %w", v, err)
		}
	}
	indexers := cache.Indexers{}
	if v.Namespace == "" {
		indexers[cache.NamespaceIndex] = cache.MetaNamespaceIndexFunc
	}
	tweak := func(lo *metav1.ListOptions) { lo.LabelSelector, lo.FieldSelector = v.LabelSelector, v.FieldSelector }
	if v.MetadataOnly {
		if c.metadata == nil {
			return nil, fmt.Errorf("%s: no metadata client", v)
		}
		vw.informer = metadatainformer.NewFilteredMetadataInformer(c.metadata, v.Resource, v.Namespace, c.opts.ResyncPeriod, indexers, tweak).Informer()
	} else {
		vw.informer = dynamicinformer.NewFilteredDynamicInformer(c.dynamic, v.Resource, v.Namespace, c.opts.ResyncPeriod, indexers, tweak).Informer()
	}
	if err := vw.informer.SetTransform(StripManagedFieldsTransform); err != nil {
		return nil, err
	}
	log := c.log.With("view", v.String())
	_ = vw.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		log.Warn("watch interrupted; re-listing", "error", err)
	})
	if _, err := vw.informer.AddEventHandler(writeWaker{vw}); err != nil {
		return nil, err
	}
	return vw, nil
}

func (c *Cache) run(ctx context.Context, vw *view) {
	defer c.running.Done()
	vw.informer.RunWithContext(ctx)
	c.mu.Lock()
	if c.views[vw.key] == vw {
		delete(c.views, vw.key)
	}
	c.mu.Unlock()
}

// Wait returns once every informer the cache started has stopped (their contexts
// ended, or their holders released them).
func (c *Cache) Wait() { c.running.Wait() }

// Synced tells whether every view held now finished its initial listing.
func (c *Cache) Synced() bool {
	c.mu.Lock()
	views := make([]*view, 0, len(c.views))
	for _, v := range c.views {
		views = append(views, v)
	}
	c.mu.Unlock()
	for _, v := range views {
		if !v.informer.HasSynced() {
			return false
		}
	}
	return true
}

// StripManagedFieldsTransform drops metadata.managedFields from every object an
// informer stores (as controller-runtime's cache.TransformStripManagedFields does).
// The server-side apply bookkeeping is about a third of a small object decoded, and
// grows with every writer (the operator's own finalizer and status writes add
// entries); nothing in luaop reads it, and handlers rarely would: a handler that needs
// it reads the object with luaop.kube.get(..., {live = true}). The processing core's
// client cuts it from the JSON before decoding (kubeclient/slim); this catches what
// other clients give (client-go's fakes, the metadata client).
func StripManagedFieldsTransform(obj any) (any, error) {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		StripManagedFields(o)
	case *metav1.PartialObjectMetadata:
		o.ManagedFields = nil
	}
	return obj, nil
}

// StripManagedFields drops metadata.managedFields; it writes nothing when there are
// none (client-go's fake tracker hands the same object to several readers).
func StripManagedFields(u *unstructured.Unstructured) {
	if meta, ok := u.Object["metadata"].(map[string]any); ok {
		//lint:ignore S1033 a delete is a write even of a missing key (the race detector says so), and the map may be shared
		if _, has := meta["managedFields"]; has {
			delete(meta, "managedFields")
		}
	}
}

// errNotSynced is the error of a read whose view has not finished its first list
// when the read's context ends.
var errNotSynced = errors.New("the operator's cache has not finished listing")
