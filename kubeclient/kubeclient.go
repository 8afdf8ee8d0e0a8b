package kubeclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/reference"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/eventing"
	"github.com/luaop/luaop/state"
)

// Client talks to the API server on behalf of scripts.
type Client struct {
	dynamic dynamic.Interface
	mapper  *restmapper.DeferredDiscoveryRESTMapper
	// FieldManager names the operator in managedFields (server-side apply).
	FieldManager string
	// Recorder posts the scripts' Events (luaop.info/warn/exception). The operator sets
	// it to the recorder it shares with the framework's own Events; nil (Events turned
	// off) makes Event a no-op.
	Recorder record.EventRecorder
	// Cache, when set, answers Get and List of the resources it keeps (the operator's
	// informer cache: caching.Cache), and is told about every write, so that its reads
	// show them. Nil: every read goes to the API server.
	Cache CachedReads
	// live: reads go to the API server whatever Cache keeps (Live).
	live bool
}

// CachedReads is the operator's informer cache as the scripts' client uses it
// (caching.Cache satisfies it). Get and List answer caching.ErrNotCached for what it
// does not keep; the maps they return are shared: never modified here.
type CachedReads interface {
	Get(ctx context.Context, q caching.Query) (map[string]any, error)
	List(ctx context.Context, q caching.Query) ([]map[string]any, error)
	Wrote(resource schema.GroupVersionResource, namespace, name string, written map[string]any)
}

// GetLive is Get from the API server, whatever Cache keeps ({live = true} of
// luaop.kube.get).
func (c *Client) GetLive(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	return c.liveCopy().Get(ctx, apiVersion, kind, namespace, name)
}

// ListLive is List from the API server, whatever Cache keeps ({live = true} of
// luaop.kube.list).
func (c *Client) ListLive(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error) {
	return c.liveCopy().List(ctx, apiVersion, kind, namespace, selector)
}

func (c *Client) liveCopy() *Client {
	live := *c
	live.live = true
	return &live
}

// New creates a client; it does nothing until used.
func New(cfg *rest.Config) (*Client, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	return &Client{dynamic: dyn, mapper: mapper, FieldManager: "luaop"}, nil
}

// resolve resolves apiVersion + kind, refreshing discovery once when a kind is not
// known yet (a CRD installed after start): the client of its objects, and the
// resource and the namespace as the cache keys them ("" for a cluster-scoped
// resource).
func (c *Client) resolve(apiVersion, kind, namespace string) (dynamic.ResourceInterface, caching.Query, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, caching.Query{}, fmt.Errorf("apiVersion %q: %w", apiVersion, err)
	}
	mapping, err := c.restMapping(gv.WithKind(kind).GroupKind(), gv.Version)
	if err != nil {
		return nil, caching.Query{}, fmt.Errorf("%s %s is not served by the cluster: %w", apiVersion, kind, err)
	}
	q := caching.Query{Resource: mapping.Resource, Kind: kind}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		q.Namespace = namespace
		return c.dynamic.Resource(mapping.Resource).Namespace(namespace), q, nil
	}
	return c.dynamic.Resource(mapping.Resource), q, nil
}

// cached tells whether reads may be answered from the cache.
func (c *Client) cached() bool { return c.Cache != nil && !c.live }

// wrote announces a write to the cache (written nil: a deletion).
func (c *Client) wrote(q caching.Query, name string, written map[string]any) {
	if c.Cache != nil {
		c.Cache.Wrote(q.Resource, q.Namespace, name, written)
	}
}

// restMapping resolves a kind, refreshing discovery once when it is not known yet.
func (c *Client) restMapping(gk schema.GroupKind, version string) (*meta.RESTMapping, error) {
	mapping, err := c.mapper.RESTMapping(gk, version)
	if meta.IsNoMatchError(err) {
		c.mapper.Reset()
		mapping, err = c.mapper.RESTMapping(gk, version)
	}
	return mapping, err
}

// Get reads one object: from the cache when it keeps the resource there (a miss is
// NotFound where the cache holds the whole namespace), else from the API server.
func (c *Client) Get(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	r, q, err := c.resolve(apiVersion, kind, namespace)
	if err != nil {
		return nil, err
	}
	if c.cached() {
		q.Name = name
		if obj, err := c.Cache.Get(ctx, q); !errors.Is(err, caching.ErrNotCached) {
			return obj, err
		}
	}
	obj, err := r.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return obj.Object, nil
}

// List lists objects, optionally by label selector ("app=x,tier!=db").
// From the cache when it keeps every object the list selects, else from the API
// server.
func (c *Client) List(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error) {
	r, q, err := c.resolve(apiVersion, kind, namespace)
	if err != nil {
		return nil, err
	}
	if c.cached() {
		if q.Selector, err = labels.Parse(selector); err != nil {
			return nil, fmt.Errorf("label selector %q: %w", selector, err)
		}
		if items, err := c.Cache.List(ctx, q); !errors.Is(err, caching.ErrNotCached) {
			return items, err
		}
	}
	list, err := r.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, len(list.Items))
	for i := range list.Items {
		out[i] = list.Items[i].Object
	}
	return out, nil
}

// Create creates an object described by its own apiVersion, kind and metadata.
func (c *Client) Create(ctx context.Context, obj map[string]any) (map[string]any, error) {
	apiVersion, kind, ns, _ := state.Identity(obj)
	r, q, err := c.resolve(apiVersion, kind, ns)
	if err != nil {
		return nil, err
	}
	created, err := r.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{FieldManager: c.FieldManager})
	if err != nil {
		return nil, err
	}
	c.wrote(q, created.GetName(), created.Object)
	return created.Object, nil
}

// Patch patches an object: patchType "merge" (default), "json" or "strategic".
func (c *Client) Patch(ctx context.Context, apiVersion, kind, namespace, name string, patch any, patchType string) (map[string]any, error) {
	r, q, err := c.resolve(apiVersion, kind, namespace)
	if err != nil {
		return nil, err
	}
	pt := types.MergePatchType
	switch patchType {
	case "", "merge":
	case "json":
		pt = types.JSONPatchType
	case "strategic":
		pt = types.StrategicMergePatchType
	default:
		return nil, fmt.Errorf("patch type %q: use merge, json or strategic", patchType)
	}
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	out, err := r.Patch(ctx, name, pt, data, metav1.PatchOptions{FieldManager: c.FieldManager})
	if err != nil {
		return nil, err
	}
	c.wrote(q, name, out.Object)
	return out.Object, nil
}

// Delete deletes an object; dependents are deleted in the background.
func (c *Client) Delete(ctx context.Context, apiVersion, kind, namespace, name string) error {
	r, q, err := c.resolve(apiVersion, kind, namespace)
	if err != nil {
		return err
	}
	policy := metav1.DeletePropagationBackground
	if err := r.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
		return err
	}
	c.wrote(q, name, nil)
	return nil
}

// Apply applies an object with server-side apply under the operator's field manager.
func (c *Client) Apply(ctx context.Context, obj map[string]any, force bool) (map[string]any, error) {
	apiVersion, kind, ns, name := state.Identity(obj)
	r, q, err := c.resolve(apiVersion, kind, ns)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	out, err := r.Patch(ctx, name, types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: c.FieldManager, Force: &force})
	if err != nil {
		return nil, err
	}
	c.wrote(q, name, out.Object)
	return out.Object, nil
}

// Event posts a core/v1 Event about an object (kopf's info/warn/exception) through
// c.Recorder, the operator's shared recorder, which rate-limits and aggregates (see
// package eventing). eventType is "Normal" or "Warning"; the reason must not be empty;
// the object needs at least apiVersion, kind and metadata.name (namespace, uid and
// resourceVersion are used when present). Messages longer than 1000 bytes are
// truncated. Without a recorder (events are turned off) a valid call does nothing.
// Posting is asynchronous: a nil error means the Event is queued, not written.
func (c *Client) Event(ctx context.Context, obj map[string]any, eventType, reason, message string) error {
	anyType, canAnyType := c.Recorder.(anyTypeRecorder)
	standard := eventType == corev1.EventTypeNormal || eventType == corev1.EventTypeWarning
	if strings.TrimSpace(eventType) == "" || !standard && c.Recorder != nil && !canAnyType {
		return fmt.Errorf("event type %q: use %q or %q", eventType, corev1.EventTypeNormal, corev1.EventTypeWarning)
	}
	if strings.TrimSpace(reason) == "" {
		return errors.New("an event needs a reason")
	}
	ref, err := eventSubject(obj)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.Recorder == nil {
		return nil
	}
	if !standard {
		return anyType.EventOfAnyType(ctx, ref, eventType, reason, eventing.Truncate(message))
	}
	c.Recorder.Event(ref, eventType, reason, eventing.Truncate(message))
	return nil
}

// anyTypeRecorder is the optional capability of a recorder to post Events of a type
// other than Normal and Warning (eventing.Recorder has it; kopf.event takes any type).
type anyTypeRecorder interface {
	EventOfAnyType(ctx context.Context, object runtime.Object, eventtype, reason, message string) error
}

// eventSubject is the object an Event is about, reduced to what its reference needs.
func eventSubject(obj map[string]any) (*unstructured.Unstructured, error) {
	apiVersion, kind, namespace, name := state.Identity(obj)
	if kind == "" || name == "" || apiVersion == "" {
		return nil, fmt.Errorf("an event needs an object with apiVersion, kind and metadata.name (got apiVersion %q, kind %q, name %q)", apiVersion, kind, name)
	}
	if _, err := schema.ParseGroupVersion(apiVersion); err != nil {
		return nil, fmt.Errorf("event object apiVersion %q: %w", apiVersion, err)
	}
	m, _ := obj["metadata"].(map[string]any)
	uid, _ := m["uid"].(string)
	rv, _ := m["resourceVersion"].(string)
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion(rv)
	// The recorder builds the same reference; checking here turns its logged failure
	// into the script's error.
	if _, err := reference.GetReference(nil, u); err != nil {
		return nil, fmt.Errorf("an event's object: %w", err)
	}
	return u, nil
}
