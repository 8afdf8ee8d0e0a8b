// Package kubeclient is the Kubernetes client that Lua scripts use through luaop.kube:
// any resource by apiVersion and kind (resolved with a cached discovery REST mapper),
// objects as plain JSON maps, and Kubernetes Events. It satisfies luabind.Kube.
package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// Client talks to the API server on behalf of scripts.
type Client struct {
	dynamic dynamic.Interface
	core    kubernetes.Interface
	mapper  *restmapper.DeferredDiscoveryRESTMapper
	// FieldManager names the operator in managedFields (server-side apply).
	FieldManager string
}

// New creates a client; it does nothing until used.
func New(cfg *rest.Config) (*Client, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	return &Client{dynamic: dyn, core: core, mapper: mapper, FieldManager: "luaop"}, nil
}

// resource resolves apiVersion + kind, refreshing discovery once when a kind is not
// known yet (a CRD installed after start).
func (c *Client) resource(apiVersion, kind, namespace string) (dynamic.ResourceInterface, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, fmt.Errorf("apiVersion %q: %w", apiVersion, err)
	}
	mapping, err := c.mapper.RESTMapping(gv.WithKind(kind).GroupKind(), gv.Version)
	if meta.IsNoMatchError(err) {
		c.mapper.Reset()
		mapping, err = c.mapper.RESTMapping(gv.WithKind(kind).GroupKind(), gv.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s is not served by the cluster: %w", apiVersion, kind, err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dynamic.Resource(mapping.Resource).Namespace(namespace), nil
	}
	return c.dynamic.Resource(mapping.Resource), nil
}

func typeOf(obj map[string]any) (apiVersion, kind, namespace, name string) {
	apiVersion, _ = obj["apiVersion"].(string)
	kind, _ = obj["kind"].(string)
	m, _ := obj["metadata"].(map[string]any)
	namespace, _ = m["namespace"].(string)
	name, _ = m["name"].(string)
	return
}

// Get reads one object.
func (c *Client) Get(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	r, err := c.resource(apiVersion, kind, namespace)
	if err != nil {
		return nil, err
	}
	obj, err := r.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return obj.Object, nil
}

// List lists objects, optionally by label selector ("app=x,tier!=db").
func (c *Client) List(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error) {
	r, err := c.resource(apiVersion, kind, namespace)
	if err != nil {
		return nil, err
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
	apiVersion, kind, ns, _ := typeOf(obj)
	r, err := c.resource(apiVersion, kind, ns)
	if err != nil {
		return nil, err
	}
	created, err := r.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{FieldManager: c.FieldManager})
	if err != nil {
		return nil, err
	}
	return created.Object, nil
}

// Patch patches an object: patchType "merge" (default), "json" or "strategic".
func (c *Client) Patch(ctx context.Context, apiVersion, kind, namespace, name string, patch any, patchType string) (map[string]any, error) {
	r, err := c.resource(apiVersion, kind, namespace)
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
	return out.Object, nil
}

// Delete deletes an object; dependents are deleted in the background.
func (c *Client) Delete(ctx context.Context, apiVersion, kind, namespace, name string) error {
	r, err := c.resource(apiVersion, kind, namespace)
	if err != nil {
		return err
	}
	policy := metav1.DeletePropagationBackground
	return r.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy})
}

// Apply applies an object with server-side apply under the operator's field manager.
func (c *Client) Apply(ctx context.Context, obj map[string]any, force bool) (map[string]any, error) {
	apiVersion, kind, ns, name := typeOf(obj)
	r, err := c.resource(apiVersion, kind, ns)
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
	return out.Object, nil
}

// Event posts a core/v1 Event about an object (kopf's info/warn/exception).
func (c *Client) Event(ctx context.Context, obj map[string]any, eventType, reason, message string) error {
	apiVersion, kind, ns, name := typeOf(obj)
	m, _ := obj["metadata"].(map[string]any)
	uid, _ := m["uid"].(string)
	objectNamespace := ns
	if ns == "" {
		ns = metav1.NamespaceDefault // events of cluster-scoped objects go to default
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: strings.ToLower(name) + ".", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{APIVersion: apiVersion, Kind: kind, Namespace: objectNamespace, Name: name, UID: types.UID(uid)},
		Reason:         reason,
		Message:        message,
		Type:           eventType,
		Source:         corev1.EventSource{Component: "luaop"},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	_, err := c.core.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
	return err
}
