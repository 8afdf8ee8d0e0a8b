package caching

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"
)

// Query is a read of the cache: one object (Name) or a list (Selector).
type Query struct {
	Resource schema.GroupVersionResource
	// Kind is written into the objects of metadata-only views, which come without
	// their own.
	Kind string
	// Namespace is the object's namespace, or the list's ("" for every namespace,
	// and for cluster-scoped resources).
	Namespace string
	Name      string
	// Selector selects a list's objects by label; nil: all of them.
	Selector labels.Selector
}

// ErrNotCached is the answer of a read that no view serving reads holds: the
// resource (in that namespace) is not cached at all, and the caller reads it from
// the API server.
var ErrNotCached = errors.New("not cached")

// ErrPartial is wrapped, with ErrNotCached, by the answer of a read the views of
// its resource hold only in part: a list no view's label selector is implied by, a
// Get missing from views that all select by label. The caller reads it from the API
// server, as with ErrNotCached: another script's selected watch of the same
// resource must not change what a read returns. The cache says it once per resource,
// namespace and selector (Info, with what to declare to have it cached).
var ErrPartial = errors.New("the operator's cache does not hold every object the read selects")

// Get answers a read of one object from the views that serve reads of its resource
// and namespace, after their first list and after the writes announced to them
// (Wrote). A miss is a NotFound when a view holds every object of the namespace;
// when every such view selects by label, a miss may be an object they do not
// select: ErrPartial (and ErrNotCached). ErrNotCached when no view holds the
// resource there. The map is the cache's: callers must not
// modify it.
func (c *Cache) Get(ctx context.Context, q Query) (map[string]any, error) {
	id := fields.Set{"metadata.name": q.Name, "metadata.namespace": q.Namespace}
	views := c.serving(q, func(v *view) bool { return v.fields == nil || v.fields.Matches(id) })
	if len(views) == 0 {
		return nil, ErrNotCached
	}
	key := q.Name
	if q.Namespace != "" {
		key = q.Namespace + "/" + q.Name
	}
	definitive := false
	for _, v := range views {
		if err := v.waitSynced(ctx); err != nil {
			return nil, err
		}
		c.awaitWrites(ctx, v, func(k string, _ *expectation) bool { return k == key })
		if obj, found, _ := v.informer.GetIndexer().GetByKey(key); found {
			return asMap(obj, q), nil
		}
		if v.labels.Empty() {
			definitive = true
			break
		}
	}
	if !definitive {
		return nil, c.partial(q, "", views)
	}
	return nil, apierrors.NewNotFound(q.Resource.GroupResource(), q.Name)
}

// List answers a list from a view that holds every object it selects (its label
// selector is implied by the list's: Covers), after its first list and the writes
// announced to it, sorted by namespace and name as the API server sorts them.
// ErrNotCached when no view holds the resource there; an error wrapping ErrPartial
// (and ErrNotCached) when views hold it but none holds all the list selects. The maps are the cache's:
// callers must not modify them.
func (c *Cache) List(ctx context.Context, q Query) ([]map[string]any, error) {
	sel := q.Selector
	if sel == nil {
		sel = labels.Everything()
	}
	all := c.serving(q, func(v *view) bool { return true })
	if len(all) == 0 {
		return nil, ErrNotCached
	}
	i := slices.IndexFunc(all, func(v *view) bool { return v.fields == nil && Covers(v.labels, sel) })
	if i < 0 {
		return nil, c.partial(q, sel.String(), all)
	}
	v := all[i]
	if err := v.waitSynced(ctx); err != nil {
		return nil, err
	}
	c.awaitWrites(ctx, v, func(_ string, e *expectation) bool { return q.Namespace == "" || e.namespace == q.Namespace })
	var out []map[string]any
	for _, obj := range v.candidates(q.Namespace, sel) {
		m, err := meta.Accessor(obj)
		if err != nil || q.Namespace != "" && m.GetNamespace() != q.Namespace || !sel.Matches(labels.Set(m.GetLabels())) {
			continue
		}
		out = append(out, asMap(obj, q))
	}
	slices.SortFunc(out, func(a, b map[string]any) int {
		ma, mb := metaOf(a), metaOf(b)
		if d := strings.Compare(str(ma["namespace"]), str(mb["namespace"])); d != 0 {
			return d
		}
		return strings.Compare(str(ma["name"]), str(mb["name"]))
	})
	return out, nil
}

// serving are the views serving reads of q's resource that hold q's namespace and
// pass keep: whole objects before metadata-only ones, unselected before selected.
func (c *Cache) serving(q Query, keep func(*view) bool) []*view {
	c.mu.Lock()
	var out []*view
	for _, v := range c.views {
		if v.servers > 0 && v.key.Resource == q.Resource && (v.key.Namespace == "" || v.key.Namespace == q.Namespace) {
			out = append(out, v)
		}
	}
	c.mu.Unlock()
	out = slices.DeleteFunc(out, func(v *view) bool { return !keep(v) })
	rank := func(v *view) int {
		r := 0
		if v.key.MetadataOnly {
			r += 2
		}
		if !v.labels.Empty() || v.fields != nil {
			r++
		}
		return r
	}
	slices.SortStableFunc(out, func(a, b *view) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a.key.String(), b.key.String())
	})
	return out
}

// waitSynced waits for the view's first list.
func (v *view) waitSynced(ctx context.Context) error {
	if v.informer.HasSynced() {
		return nil
	}
	if !cache.WaitForCacheSync(ctx.Done(), v.informer.HasSynced) {
		return fmt.Errorf("%w of %s (is list and watch of it granted? luaop rbac): %w", errNotSynced, v.key, context.Cause(ctx))
	}
	return nil
}

// candidates are the stored objects a list may return: through a label's index
// when the selector requires values of a label, else the namespace's index, else
// all of them. The caller filters them.
func (v *view) candidates(namespace string, sel labels.Selector) []any {
	idx := v.informer.GetIndexer()
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		if op := r.Operator(); op != selection.Equals && op != selection.DoubleEquals && op != selection.In {
			continue
		}
		if !v.ensureLabelIndex(r.Key()) {
			break
		}
		var out []any
		for _, val := range r.ValuesUnsorted() {
			items, err := idx.ByIndex(labelIndex(r.Key()), val)
			if err != nil {
				return idx.List()
			}
			out = append(out, items...)
		}
		return out
	}
	if namespace != "" && v.key.Namespace == "" {
		if items, err := idx.ByIndex(cache.NamespaceIndex, namespace); err == nil {
			return items
		}
	}
	return idx.List()
}

func labelIndex(key string) string { return "label:" + key }

// ensureLabelIndex adds an index of label key's values to the store, once.
func (v *view) ensureLabelIndex(key string) bool {
	v.mu.Lock()
	done := v.indexed[key]
	v.mu.Unlock()
	if done {
		return true
	}
	name := labelIndex(key)
	err := v.informer.AddIndexers(cache.Indexers{name: func(obj any) ([]string, error) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, nil
		}
		if val, ok := m.GetLabels()[key]; ok {
			return []string{val}, nil
		}
		return nil, nil
	}})
	if err != nil && v.informer.GetIndexer().GetIndexers()[name] == nil {
		return false // stopped: the list goes through every object
	}
	v.mu.Lock()
	v.indexed[key] = true
	v.mu.Unlock()
	return true
}

// asMap is a stored object as a read returns it: whole objects as they are stored,
// metadata-only ones as apiVersion, kind and metadata.
func asMap(obj any, q Query) map[string]any {
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		return o.Object
	case *metav1.PartialObjectMetadata:
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&o.ObjectMeta)
		if err != nil {
			m = map[string]any{"name": o.Name, "namespace": o.Namespace}
		}
		return map[string]any{"apiVersion": q.Resource.GroupVersion().String(), "kind": q.Kind, "metadata": m}
	}
	return nil
}

func metaOf(obj map[string]any) map[string]any {
	m, _ := obj["metadata"].(map[string]any)
	return m
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// partial is the answer of a read the views hold only in part (selector "" for a
// Get): it wraps ErrPartial and ErrNotCached, and is said once per resource,
// namespace and selector, with what to declare to have it cached.
func (c *Cache) partial(q Query, selector string, views []*view) error {
	what := fmt.Sprintf("a get of %s %q", q.Resource.GroupResource(), q.Name)
	key := "get"
	if q.Name == "" {
		what, key = "a list of "+q.Resource.GroupResource().String(), "list:"+selector
		if selector != "" {
			what += " labelled " + selector
		}
	}
	err := fmt.Errorf("%w: %s in namespace %q, it holds only %s", ErrPartial, what, q.Namespace, describe(views))
	key = q.Resource.String() + "|" + q.Namespace + "|" + key
	c.mu.Lock()
	said := c.saidPartial[key]
	c.saidPartial[key] = true
	c.mu.Unlock()
	if !said {
		c.log.Info("read from the API server, not from the cache: "+err.Error()+"; declare luaop.reads(...) of it to have it cached (said once)",
			"resource", strings.TrimPrefix(q.Resource.GroupVersion().String()+"/"+q.Resource.Resource, "/"), "namespace", q.Namespace)
	}
	return fmt.Errorf("%w (%w)", ErrNotCached, err)
}

func describe(views []*view) string {
	var parts []string
	for _, v := range views {
		parts = append(parts, v.key.String())
	}
	return strings.Join(parts, ", and ")
}
