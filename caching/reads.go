package caching

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// ErrPartial is wrapped by the error of a list the cache holds the resource for, but
// not every object the list selects: no view's selector is implied by the list's.
// It is an answer, not a reason to read from the API server: the caller says what to
// declare instead.
var ErrPartial = errors.New("the operator's cache does not hold every object the list selects")

// Get answers a read of one object from the views that serve reads of its resource
// and namespace, after their first list and after the writes announced to them
// (Wrote). A miss is a NotFound: the object does not exist, or (when every such view
// selects by label) is not one they select, which the message says. ErrNotCached
// when no view holds the resource there. The map is the cache's: callers must not
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
	return nil, notFound(q, views, definitive)
}

// List answers a list from a view that holds every object it selects (its label
// selector is implied by the list's: Covers), after its first list and the writes
// announced to it, sorted by namespace and name as the API server sorts them.
// ErrNotCached when no view holds the resource there; an error wrapping ErrPartial
// when views hold it but none holds all the list selects. The maps are the cache's:
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
		return nil, partial(q, sel, all)
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

// notFound is the NotFound of a Get; when no view that answered holds every object
// of the namespace, it says what they hold.
func notFound(q Query, views []*view, definitive bool) error {
	gr := q.Resource.GroupResource()
	if definitive {
		return apierrors.NewNotFound(gr, q.Name)
	}
	msg := fmt.Sprintf("%s %q not found in the operator's cache, which holds only %s; an object they do not select reads as not found: declare luaop.reads(...) for it, or read it with {live = true}",
		gr.String(), q.Name, describe(views))
	return &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound,
		Reason: metav1.StatusReasonNotFound, Message: msg, Details: &metav1.StatusDetails{Group: gr.Group, Kind: gr.Resource, Name: q.Name}}}
}

// partial is the error of a list no view holds completely.
func partial(q Query, sel labels.Selector, views []*view) error {
	what := "every object"
	if !sel.Empty() {
		what = "the objects labelled " + sel.String()
	}
	return fmt.Errorf("%w: listing %s of %s, it holds only %s: declare luaop.reads(...) with labels its selector implies, or list with {live = true}",
		ErrPartial, what, q.Resource.GroupResource(), describe(views))
}

func describe(views []*view) string {
	var parts []string
	for _, v := range views {
		parts = append(parts, v.key.String())
	}
	return strings.Join(parts, ", and ")
}
