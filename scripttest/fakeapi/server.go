package fakeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Call is one luaop.kube call (or event) a handler made, as the server answered it.
type Call struct {
	Verb       string `json:"verb"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name,omitempty"`
	Body       any    `json:"body,omitempty"` // created/applied object, patch
	Error      string `json:"error,omitempty"`
	// Code is the HTTP status of a refused call (409, 422, ...), 0 on success.
	Code int `json:"code,omitempty"`
	// Injected: the answer was a failure of the case's fail: list.
	Injected bool `json:"injected,omitempty"`

	manager string // the field manager of a write
}

// Event is one Event a handler posted (luaop.info/warn/exception, ctx.logger).
type Event struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Options configure a Server.
type Options struct {
	// CRDs are the custom resources it serves with their schemas; other custom
	// resources are stored as given.
	CRDs []*apiextensionsv1.CustomResourceDefinition
	// Objects are the objects it holds at the start, stored as given (a uid, a
	// creationTimestamp and a resourceVersion added when they have none).
	Objects []map[string]any
	// Failures are the calls it refuses (a test case's fail:).
	Failures []Failure
	// FieldManager is the manager of the writes (luaop's client: "luaop").
	FieldManager string
	// Now is the clock of timestamps (time.Now).
	Now func() time.Time
}

// Server is the in-memory API server. It implements luabind.Kube.
type Server struct {
	mu            sync.Mutex
	kinds         map[schema.GroupVersionKind]*kind
	crdGroupKinds map[schema.GroupKind]bool
	objects       map[string]*unstructured.Unstructured
	fields        map[schema.GroupVersionKind]*managedfields.FieldManager
	failures      []*failureState
	calls         []Call
	events        []Event
	rv            int
	manager       string
	now           func() time.Time
}

// New makes a server holding o.Objects and serving o.CRDs; a CRD it cannot serve
// (its schema is not structural) is an error naming it.
func New(o Options) (*Server, error) {
	s := &Server{kinds: map[schema.GroupVersionKind]*kind{}, crdGroupKinds: map[schema.GroupKind]bool{},
		objects: map[string]*unstructured.Unstructured{}, fields: map[schema.GroupVersionKind]*managedfields.FieldManager{},
		calls: []Call{}, events: []Event{}, manager: o.FieldManager, now: o.Now}
	if s.manager == "" {
		s.manager = "luaop"
	}
	if s.now == nil {
		s.now = time.Now
	}
	for _, crd := range o.CRDs {
		if err := s.addCRD(crd); err != nil {
			return nil, err
		}
	}
	for _, f := range o.Failures {
		if err := f.check(); err != nil {
			return nil, err
		}
		s.failures = append(s.failures, &failureState{Failure: f})
	}
	for _, obj := range o.Objects {
		u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(normalizeJSON(obj))}
		if u.GetUID() == "" {
			u.SetUID(types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", len(s.objects)+100)))
		}
		if ts := u.GetCreationTimestamp(); ts.IsZero() {
			u.SetCreationTimestamp(metav1.NewTime(s.now()))
		}
		if u.GetResourceVersion() == "" {
			s.stamp(u)
		}
		s.objects[objectKey(u.GroupVersionKind().GroupKind(), u.GetNamespace(), u.GetName())] = u
	}
	return s, nil
}

func objectKey(gk schema.GroupKind, ns, name string) string {
	return gk.Group + "|" + gk.Kind + "|" + ns + "|" + name
}

// normalizeJSON makes a value JSON's types (numbers float64 or int64 as the decoder
// of the API server's JSON gives them).
func normalizeJSON(v map[string]any) map[string]any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		out := map[string]any{}
		_ = json.Unmarshal(data, &out)
		return out
	}
	return u.Object
}

func (s *Server) stamp(u *unstructured.Unstructured) {
	s.rv++
	u.SetResourceVersion(strconv.Itoa(s.rv))
}

func (s *Server) record(c Call, err error) {
	if err != nil {
		c.Error = err.Error()
		c.Injected = Injected(err)
		var st apierrors.APIStatus
		if errors.As(err, &st) {
			c.Code = int(st.Status().Code)
		}
	}
	s.calls = append(s.calls, c)
}

// Calls are the calls made so far, in order.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Events are the Events posted so far, in order.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// Objects are copies of the objects the server holds, sorted by kind, namespace
// and name.
func (s *Server) Objects() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.objects))
	for k := range s.objects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]map[string]any, 0, len(keys))
	for _, k := range keys {
		out = append(out, runtime.DeepCopyJSON(s.objects[k].Object))
	}
	return out
}

// Object is a copy of the object of apiVersion's group, kind, namespace and name.
func (s *Server) Object(apiVersion, kindName, ns, name string) (map[string]any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gv, _ := schema.ParseGroupVersion(apiVersion)
	u, ok := s.objects[objectKey(gv.WithKind(kindName).GroupKind(), ns, name)]
	if !ok {
		return nil, false
	}
	return runtime.DeepCopyJSON(u.Object), true
}

// Client is the server as one field manager's client sees it (luabind.Kube): the
// Server's own methods are its default manager's.
type Client struct {
	s       *Server
	manager string
}

// As is a client of the server writing as field manager (server-side apply,
// managedFields).
func (s *Server) As(manager string) *Client { return &Client{s: s, manager: manager} }

func (s *Server) client() *Client { return &Client{s: s, manager: s.manager} }

// Get reads one object (see Client.Get).
func (s *Server) Get(ctx context.Context, apiVersion, kindName, ns, name string) (map[string]any, error) {
	return s.client().Get(ctx, apiVersion, kindName, ns, name)
}

// List lists objects (see Client.List).
func (s *Server) List(ctx context.Context, apiVersion, kindName, ns, selector string) ([]map[string]any, error) {
	return s.client().List(ctx, apiVersion, kindName, ns, selector)
}

// Create creates an object (see Client.Create).
func (s *Server) Create(ctx context.Context, obj map[string]any) (map[string]any, error) {
	return s.client().Create(ctx, obj)
}

// Patch patches an object (see Client.Patch).
func (s *Server) Patch(ctx context.Context, apiVersion, kindName, ns, name string, patch any, patchType string) (map[string]any, error) {
	return s.client().Patch(ctx, apiVersion, kindName, ns, name, patch, patchType)
}

// Delete deletes an object (see Client.Delete).
func (s *Server) Delete(ctx context.Context, apiVersion, kindName, ns, name string) error {
	return s.client().Delete(ctx, apiVersion, kindName, ns, name)
}

// Apply applies an object (see Client.Apply).
func (s *Server) Apply(ctx context.Context, obj map[string]any, force bool) (map[string]any, error) {
	return s.client().Apply(ctx, obj, force)
}

// Event records an Event (see Client.Event).
func (s *Server) Event(ctx context.Context, obj map[string]any, eventType, reason, message string) error {
	return s.client().Event(ctx, obj, eventType, reason, message)
}

// requestContext is the context of a request to ns (the namespace of the URL).
func requestContext(ctx context.Context, k *kind, ns string) context.Context {
	if !k.namespaced {
		ns = ""
	}
	return genericapirequest.WithNamespace(ctx, ns)
}

// Get reads one object.
func (cl *Client) Get(ctx context.Context, apiVersion, kindName, ns, name string) (map[string]any, error) {
	s := cl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Call{Verb: "get", APIVersion: apiVersion, Kind: kindName, Namespace: ns, Name: name}
	out, err := s.get(c)
	s.record(c, err)
	return out, err
}

func (s *Server) get(c Call) (map[string]any, error) {
	k, err := s.kindOf(c.APIVersion, c.Kind)
	if err != nil {
		return nil, err
	}
	if err := s.inject(&c, k); err != nil {
		return nil, err
	}
	cur, ok := s.objects[objectKey(k.gvk.GroupKind(), scoped(k, c.Namespace), c.Name)]
	if !ok {
		return nil, apierrors.NewNotFound(k.groupResource(), c.Name)
	}
	return runtime.DeepCopyJSON(cur.Object), nil
}

func scoped(k *kind, ns string) string {
	if !k.namespaced {
		return ""
	}
	return ns
}

// List lists the objects of a kind in ns (every namespace when ""), by label
// selector.
func (cl *Client) List(ctx context.Context, apiVersion, kindName, ns, selector string) ([]map[string]any, error) {
	s := cl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Call{Verb: "list", APIVersion: apiVersion, Kind: kindName, Namespace: ns}
	if selector != "" {
		c.Body = map[string]any{"selector": selector}
	}
	out, err := s.list(c, selector)
	s.record(c, err)
	return out, err
}

func (s *Server) list(c Call, selector string) ([]map[string]any, error) {
	k, err := s.kindOf(c.APIVersion, c.Kind)
	if err != nil {
		return nil, err
	}
	if err := s.inject(&c, k); err != nil {
		return nil, err
	}
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unable to parse requirement: %v", err))
	}
	var keys []string
	for key, o := range s.objects {
		if o.GroupVersionKind().GroupKind() != k.gvk.GroupKind() || (k.namespaced && c.Namespace != "" && o.GetNamespace() != c.Namespace) {
			continue
		}
		if sel.Matches(labels.Set(o.GetLabels())) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	out := make([]map[string]any, 0, len(keys))
	for _, key := range keys {
		out = append(out, runtime.DeepCopyJSON(s.objects[key].Object))
	}
	return out, nil
}

// Create creates an object described by its own apiVersion, kind and metadata.
func (cl *Client) Create(ctx context.Context, obj map[string]any) (map[string]any, error) {
	s := cl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(normalizeJSON(obj))}
	c := Call{manager: cl.manager, Verb: "create", APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(), Body: runtime.DeepCopyJSON(u.Object)}
	out, err := s.create(ctx, c, u)
	s.record(c, err)
	return out, err
}

func (s *Server) create(ctx context.Context, c Call, u *unstructured.Unstructured) (map[string]any, error) {
	k, err := s.kindOf(c.APIVersion, c.Kind)
	if err != nil {
		return nil, err
	}
	if err := s.inject(&c, k); err != nil {
		return nil, err
	}
	if _, err := s.decode(k, u); err != nil {
		return nil, err
	}
	if u.GetResourceVersion() != "" {
		// The storage's error, not a status: the API server answers 500 with its text.
		return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
			Message: "resourceVersion should not be set on objects to be created"}}
	}
	rest.FillObjectMetaSystemFields(u)
	strategy := s.strategy(k)
	if u.GetGenerateName() != "" && u.GetName() == "" {
		u.SetName(strategy.GenerateName(u.GetGenerateName()))
	}
	if err := rest.BeforeCreate(strategy, requestContext(ctx, k, c.Namespace), u); err != nil {
		return nil, err
	}
	key := objectKey(k.gvk.GroupKind(), u.GetNamespace(), u.GetName())
	if cur, exists := s.objects[key]; exists {
		err := apierrors.NewAlreadyExists(k.groupResource(), u.GetName())
		if cur.GetDeletionTimestamp() != nil {
			err.ErrStatus.Message = "object is being deleted: " + err.ErrStatus.Message
		}
		return nil, err
	}
	fm, err := s.fieldManager(k)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	live, _ := unstructuredCreater{}.New(k.gvk)
	withFields, err := fm.Update(live, u, c.manager)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	u = withFields.(*unstructured.Unstructured)
	s.stamp(u)
	s.objects[key] = u
	return runtime.DeepCopyJSON(u.Object), nil
}

// decode does to an object written what the API server's decoder does: a built-in
// kind's is typed, a custom resource's pruned, coerced and defaulted. It returns
// the paths pruned (custom resources).
func (s *Server) decode(k *kind, u *unstructured.Unstructured) ([]string, error) {
	if u.GetAPIVersion() != k.gvk.GroupVersion().String() || u.GetKind() != k.gvk.Kind {
		u.SetGroupVersionKind(k.gvk)
	}
	switch {
	case k.builtin:
		return nil, decodeBuiltin(k.gvk, u)
	case k.crd != nil:
		pruned, err := k.crd.coerce(u)
		if err != nil {
			return pruned, apierrors.NewBadRequest(err.Error())
		}
		return pruned, nil
	}
	return nil, nil
}

// writeStrategy is what the server does to a kind's writes beside the generic
// metadata rules of rest.BeforeCreate and BeforeUpdate.
type writeStrategy interface {
	rest.RESTCreateStrategy
	rest.RESTUpdateStrategy
}

func (s *Server) strategy(k *kind) writeStrategy {
	if k.crd != nil {
		return k.crd.strategy
	}
	if k.builtin {
		return newBuiltinStrategy(k)
	}
	return schemalessStrategy{newBuiltinStrategy(k)}
}

func (s *Server) statusStrategy(k *kind) rest.RESTUpdateStrategy {
	if k.crd != nil {
		return customResourceStatusStrategy{k.crd.strategy}
	}
	return builtinStatusStrategy{newBuiltinStrategy(k)}
}

// fieldManager is the kind's field manager (managedFields, server-side apply), as
// the API server makes it: a built-in kind's with client-go's models, a custom
// resource's with its CRD's, a kind it knows nothing of with deduced types. A kind
// with a status subresource resets status in the main resource's writes.
func (s *Server) fieldManager(k *kind) (*managedfields.FieldManager, error) {
	if fm, ok := s.fields[k.gvk]; ok {
		return fm, nil
	}
	var reset map[fieldpath.APIVersion]fieldpath.Filter
	if k.status {
		reset = map[fieldpath.APIVersion]fieldpath.Filter{
			fieldpath.APIVersion(k.gvk.GroupVersion().String()): fieldpath.NewExcludeSetFilter(fieldpath.NewSet(fieldpath.MakePathOrDie("status"))),
		}
	}
	var fm *managedfields.FieldManager
	var err error
	switch {
	case k.builtin:
		fm, err = managedfields.NewDefaultFieldManager(builtinTypeConverter(), nopConverter{}, nopDefaulter{}, unstructuredCreater{}, k.gvk, k.gvk.GroupVersion(), "", reset)
	case k.crd != nil:
		fm, err = managedfields.NewDefaultCRDFieldManager(k.crd.typeConverter, nopConverter{}, nopDefaulter{}, unstructuredCreater{}, k.gvk, k.gvk.GroupVersion(), "", reset)
	default:
		fm, err = managedfields.NewDefaultCRDFieldManager(managedfields.NewDeducedTypeConverter(), nopConverter{}, nopDefaulter{}, unstructuredCreater{}, k.gvk, k.gvk.GroupVersion(), "", reset)
	}
	if err != nil {
		return nil, err
	}
	s.fields[k.gvk] = fm
	return fm, nil
}

// Patch patches an object: patchType "merge" (default), "json" or "strategic" (a
// built-in kind's; a custom resource's is refused, as the API server refuses it).
func (cl *Client) Patch(ctx context.Context, apiVersion, kindName, ns, name string, patch any, patchType string) (map[string]any, error) {
	s := cl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Call{manager: cl.manager, Verb: "patch", APIVersion: apiVersion, Kind: kindName, Namespace: ns, Name: name, Body: copyJSON(patch)}
	out, err := s.patch(ctx, c, patch, patchType, false)
	s.record(c, err)
	return out, err
}

func copyJSON(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	_ = json.Unmarshal(data, &out)
	return out
}

func (s *Server) patch(ctx context.Context, c Call, patch any, patchType string, status bool) (map[string]any, error) {
	k, err := s.kindOf(c.APIVersion, c.Kind)
	if err != nil {
		return nil, err
	}
	if err := s.inject(&c, k); err != nil {
		return nil, err
	}
	key := objectKey(k.gvk.GroupKind(), scoped(k, c.Namespace), c.Name)
	cur, ok := s.objects[key]
	if !ok {
		return nil, apierrors.NewNotFound(k.groupResource(), c.Name)
	}
	return s.patchObject(ctx, c.manager, k, cur, patch, patchType, status)
}

// patchObject applies patch to cur and stores the result (update).
func (s *Server) patchObject(ctx context.Context, manager string, k *kind, cur *unstructured.Unstructured, patch any, patchType string, status bool) (map[string]any, error) {
	p, err := json.Marshal(patch)
	if err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	curJSON, err := json.Marshal(cur.Object)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	patched, err := applyPatch(k, curJSON, p, patchType)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(patched); err != nil {
		return nil, apierrors.NewBadRequest(err.Error())
	}
	return s.update(ctx, manager, k, cur, u, status)
}

// applyPatch applies a patch to an object's JSON as the API server's patcher does.
func applyPatch(k *kind, cur, p []byte, patchType string) ([]byte, error) {
	switch patchType {
	case "", "merge":
		out, err := jsonpatch.MergePatch(cur, p)
		if errors.Is(err, jsonpatch.ErrBadJSONPatch) {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		return out, nil
	case "json":
		jp, err := jsonpatch.DecodePatch(p)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		out, err := jp.Apply(cur)
		if err != nil {
			return nil, apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", err.Error(), 0, false)
		}
		return out, nil
	case "strategic":
		if !k.builtin {
			return nil, &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnsupportedMediaType, Reason: metav1.StatusReasonUnsupportedMediaType,
				Message: "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"}}
		}
		typed, err := builtinTyped(k.gvk)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		out, err := strategicpatch.StrategicMergePatch(cur, p, typed)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		return out, nil
	}
	return nil, fmt.Errorf("patch type %q: use merge, json or strategic", patchType)
}

// update stores u, the new state of cur written to the main resource (or its status
// subresource), through the API server's update path: the preconditions the object
// carries (resourceVersion, uid), the decoder, the strategy, the field manager; a
// write that changes nothing is not stored and keeps the resourceVersion; an object
// being deleted whose last finalizer goes is deleted.
func (s *Server) update(ctx context.Context, manager string, k *kind, cur, u *unstructured.Unstructured, status bool) (map[string]any, error) {
	if rv := u.GetResourceVersion(); rv != "" && rv != cur.GetResourceVersion() {
		return nil, apierrors.NewConflict(k.groupResource(), cur.GetName(), errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	if uid := u.GetUID(); uid != "" && uid != cur.GetUID() {
		//lint:ignore ST1005 the API server's own message, word for word
		return nil, apierrors.NewConflict(k.groupResource(), cur.GetName(), fmt.Errorf("Precondition failed: UID in precondition: %v, UID in object meta: %v", uid, cur.GetUID()))
	}
	if _, err := s.decode(k, u); err != nil {
		return nil, err
	}
	var strategy rest.RESTUpdateStrategy = s.strategy(k)
	if status {
		strategy = s.statusStrategy(k)
	}
	if err := rest.BeforeUpdate(strategy, requestContext(ctx, k, cur.GetNamespace()), u, cur); err != nil {
		return nil, err
	}
	fm, err := s.fieldManager(k)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	withFields, err := fm.Update(cur, u, manager)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return s.store(k, cur, withFields.(*unstructured.Unstructured)), nil
}

// store keeps u as cur's new state unless it changes nothing, and deletes an object
// being deleted that has no finalizer left.
func (s *Server) store(k *kind, cur, u *unstructured.Unstructured) map[string]any {
	u.SetResourceVersion(cur.GetResourceVersion())
	if reflect.DeepEqual(u.Object, cur.Object) {
		return runtime.DeepCopyJSON(cur.Object)
	}
	key := objectKey(k.gvk.GroupKind(), u.GetNamespace(), u.GetName())
	if u.GetDeletionTimestamp() != nil && len(u.GetFinalizers()) == 0 {
		// Deleted: the answer is its last state, at the version it had.
		delete(s.objects, key)
		return runtime.DeepCopyJSON(u.Object)
	}
	s.stamp(u)
	s.objects[key] = u
	return runtime.DeepCopyJSON(u.Object)
}

// Delete deletes an object; one with finalizers is only marked (deletionTimestamp)
// until they are removed.
func (cl *Client) Delete(ctx context.Context, apiVersion, kindName, ns, name string) error {
	s := cl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Call{Verb: "delete", APIVersion: apiVersion, Kind: kindName, Namespace: ns, Name: name}
	err := s.delete(c)
	s.record(c, err)
	return err
}

func (s *Server) delete(c Call) error {
	k, err := s.kindOf(c.APIVersion, c.Kind)
	if err != nil {
		return err
	}
	if err := s.inject(&c, k); err != nil {
		return err
	}
	key := objectKey(k.gvk.GroupKind(), scoped(k, c.Namespace), c.Name)
	cur, ok := s.objects[key]
	if !ok {
		return apierrors.NewNotFound(k.groupResource(), c.Name)
	}
	if len(cur.GetFinalizers()) == 0 {
		delete(s.objects, key)
		return nil
	}
	if cur.GetDeletionTimestamp() != nil {
		return nil
	}
	u := cur.DeepCopy()
	now := metav1.NewTime(s.now())
	u.SetDeletionTimestamp(&now)
	zero := int64(0)
	u.SetDeletionGracePeriodSeconds(&zero)
	if u.GetGeneration() > 0 {
		u.SetGeneration(u.GetGeneration() + 1)
	}
	s.stamp(u)
	s.objects[key] = u
	return nil
}

// Apply applies an object with server-side apply under the server's field manager:
// it is created when absent; the fields another manager owns with another value are
// a conflict unless force; fields this manager applied before and no longer applies
// are removed.
func (cl *Client) Apply(ctx context.Context, obj map[string]any, force bool) (map[string]any, error) {
	s := cl.s
	s.mu.Lock()
	defer s.mu.Unlock()
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(normalizeJSON(obj))}
	c := Call{manager: cl.manager, Verb: "apply", APIVersion: u.GetAPIVersion(), Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName(), Body: runtime.DeepCopyJSON(u.Object)}
	out, err := s.apply(ctx, c, u, force)
	s.record(c, err)
	return out, err
}

func (s *Server) apply(ctx context.Context, c Call, applied *unstructured.Unstructured, force bool) (map[string]any, error) {
	k, err := s.kindOf(c.APIVersion, c.Kind)
	if err != nil {
		return nil, err
	}
	if err := s.inject(&c, k); err != nil {
		return nil, err
	}
	if k.namespaced && applied.GetNamespace() == "" {
		return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	if !k.namespaced {
		applied.SetNamespace("")
	}
	key := objectKey(k.gvk.GroupKind(), applied.GetNamespace(), applied.GetName())
	cur, exists := s.objects[key]
	fm, err := s.fieldManager(k)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	var live runtime.Object
	if exists {
		live = cur.DeepCopy()
	} else {
		live, _ = unstructuredCreater{}.New(k.gvk)
		lu := live.(*unstructured.Unstructured)
		lu.SetName(applied.GetName())
		lu.SetNamespace(applied.GetNamespace())
	}
	if rv := applied.GetResourceVersion(); rv != "" && (!exists || rv != cur.GetResourceVersion()) {
		if !exists {
			return nil, apierrors.NewNotFound(k.groupResource(), applied.GetName())
		}
		return nil, apierrors.NewConflict(k.groupResource(), applied.GetName(), errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	}
	out, err := fm.Apply(live, applied, c.manager, force)
	if err != nil {
		return nil, err
	}
	u := out.(*unstructured.Unstructured)
	if !exists {
		return s.createApplied(ctx, k, u)
	}
	if _, err := s.decode(k, u); err != nil {
		return nil, err
	}
	if err := rest.BeforeUpdate(s.strategy(k), requestContext(ctx, k, cur.GetNamespace()), u, cur); err != nil {
		return nil, err
	}
	return s.store(k, cur, u), nil
}

// createApplied stores the object an apply created.
func (s *Server) createApplied(ctx context.Context, k *kind, u *unstructured.Unstructured) (map[string]any, error) {
	if _, err := s.decode(k, u); err != nil {
		return nil, err
	}
	rest.FillObjectMetaSystemFields(u)
	if err := rest.BeforeCreate(s.strategy(k), requestContext(ctx, k, u.GetNamespace()), u); err != nil {
		return nil, err
	}
	s.stamp(u)
	s.objects[objectKey(k.gvk.GroupKind(), u.GetNamespace(), u.GetName())] = u
	return runtime.DeepCopyJSON(u.Object), nil
}

// Event records an Event a handler posted.
func (cl *Client) Event(_ context.Context, obj map[string]any, eventType, reason, message string) error {
	s := cl.s
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("an event needs a reason")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, Event{Type: eventType, Reason: reason, Message: message})
	return nil
}

// OperatorWrite does what the API server does with the operator's write of a
// handler's outcome on obj (the object as the handler saw it, held by the server
// from now on if it was not): patch (a merge patch) goes to the object, its status
// to the status subresource when the kind has one, as the operator sends them. It
// returns the object the server holds afterwards and the status fields
// ("status.greet") it dropped: a kind without status keeps none, a built-in kind
// only its own, a CRD only what its schema declares or preserves.
func (s *Server) OperatorWrite(ctx context.Context, obj, patch map[string]any) (after map[string]any, dropped []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(normalizeJSON(obj))}
	k, err := s.kindOf(u.GetAPIVersion(), u.GetKind())
	if err != nil {
		return nil, nil, err
	}
	key := objectKey(k.gvk.GroupKind(), scoped(k, u.GetNamespace()), u.GetName())
	cur, ok := s.objects[key]
	if !ok {
		if u.GetResourceVersion() == "" {
			s.stamp(u)
		}
		s.objects[key], cur = u, u
	}
	patch = normalizeJSON(patch)
	status, hasStatus := patch["status"].(map[string]any)
	after = runtime.DeepCopyJSON(cur.Object)
	main := patch
	if k.status && hasStatus {
		main = map[string]any{}
		for f, v := range patch {
			if f != "status" {
				main[f] = v
			}
		}
	}
	if len(main) > 0 {
		if after, err = s.patchObject(ctx, s.manager, k, cur, main, "merge", false); err != nil {
			return nil, nil, err
		}
	}
	if k.status && hasStatus {
		cur = s.objects[key]
		if cur == nil {
			return after, nil, nil
		}
		if after, err = s.patchObject(ctx, s.manager, k, cur, map[string]any{"status": status}, "merge", true); err != nil {
			return nil, nil, err
		}
	}
	kept, _ := after["status"].(map[string]any)
	for f, v := range status {
		if _, ok := kept[f]; !ok && v != nil {
			dropped = append(dropped, "status."+f)
		}
	}
	sort.Strings(dropped)
	return after, dropped, nil
}
