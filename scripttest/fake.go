package scripttest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/state"
)

// Call is one luaop.kube call (or event) a handler made.
type Call struct {
	Verb       string `json:"verb"`
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name,omitempty"`
	Body       any    `json:"body,omitempty"` // created/applied object, patch
	Error      string `json:"error,omitempty"`
}

// Event is one Event a handler posted (luaop.info/warn/exception, ctx.logger).
type Event struct {
	Type    string `json:"type"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// fakeKube is an in-memory API: objects by apiVersion, kind, namespace and name.
type fakeKube struct {
	mu      sync.Mutex
	objects map[string]map[string]any
	calls   []Call
	events  []Event
	rv      int
}

func objectKey(apiVersion, kind, ns, name string) string {
	return apiVersion + "|" + kind + "|" + ns + "|" + name
}

func newFakeKube(objects []map[string]any) *fakeKube {
	k := &fakeKube{objects: map[string]map[string]any{}, calls: []Call{}, events: []Event{}}
	for _, o := range objects {
		av, kind, ns, name := state.Identity(o)
		k.objects[objectKey(av, kind, ns, name)] = o
	}
	return k
}

func groupResource(apiVersion, kind string) schema.GroupResource {
	gv, _ := schema.ParseGroupVersion(apiVersion)
	plural, _ := meta.UnsafeGuessKindToResource(gv.WithKind(kind))
	return plural.GroupResource()
}

func copyJSON(v any) any {
	data, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(data, &out)
	return out
}

func (k *fakeKube) record(c Call, err error) {
	if err != nil {
		c.Error = err.Error()
	}
	k.calls = append(k.calls, c)
}

func (k *fakeKube) stamp(obj map[string]any) {
	k.rv++
	m, _ := obj["metadata"].(map[string]any)
	if m == nil {
		m = map[string]any{}
		obj["metadata"] = m
	}
	m["resourceVersion"] = fmt.Sprint(k.rv)
}

func (k *fakeKube) Get(_ context.Context, apiVersion, kind, ns, name string) (map[string]any, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	o, ok := k.objects[objectKey(apiVersion, kind, ns, name)]
	var err error
	if !ok {
		err = apierrors.NewNotFound(groupResource(apiVersion, kind), name)
	}
	k.record(Call{Verb: "get", APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name}, err)
	if err != nil {
		return nil, err
	}
	return copyJSON(o).(map[string]any), nil
}

func (k *fakeKube) List(_ context.Context, apiVersion, kind, ns, selector string) ([]map[string]any, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	sel, err := labels.Parse(selector)
	if err != nil {
		k.record(Call{Verb: "list", APIVersion: apiVersion, Kind: kind, Namespace: ns}, err)
		return nil, err
	}
	var keys []string
	for key, o := range k.objects {
		av, kd, ons, _ := state.Identity(o)
		if av != apiVersion || kd != kind || (ns != "" && ons != ns) {
			continue
		}
		m, _ := o["metadata"].(map[string]any)
		lbls := labels.Set{}
		if l, ok := m["labels"].(map[string]any); ok {
			for lk, lv := range l {
				lbls[lk] = fmt.Sprint(lv)
			}
		}
		if sel.Matches(lbls) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	out := make([]map[string]any, 0, len(keys))
	for _, key := range keys {
		out = append(out, copyJSON(k.objects[key]).(map[string]any))
	}
	c := Call{Verb: "list", APIVersion: apiVersion, Kind: kind, Namespace: ns}
	if selector != "" {
		c.Body = map[string]any{"selector": selector}
	}
	k.record(c, nil)
	return out, nil
}

func (k *fakeKube) Create(_ context.Context, obj map[string]any) (map[string]any, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	av, kind, ns, name := state.Identity(obj)
	key := objectKey(av, kind, ns, name)
	var err error
	if _, exists := k.objects[key]; exists {
		err = apierrors.NewAlreadyExists(groupResource(av, kind), name)
	}
	k.record(Call{Verb: "create", APIVersion: av, Kind: kind, Namespace: ns, Name: name, Body: copyJSON(obj)}, err)
	if err != nil {
		return nil, err
	}
	o := copyJSON(obj).(map[string]any)
	k.stamp(o)
	k.objects[key] = o
	return copyJSON(o).(map[string]any), nil
}

func (k *fakeKube) Patch(_ context.Context, apiVersion, kind, ns, name string, patch any, patchType string) (map[string]any, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := objectKey(apiVersion, kind, ns, name)
	c := Call{Verb: "patch", APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name, Body: copyJSON(patch)}
	o, ok := k.objects[key]
	if !ok {
		err := apierrors.NewNotFound(groupResource(apiVersion, kind), name)
		k.record(c, err)
		return nil, err
	}
	cur, _ := json.Marshal(o)
	p, _ := json.Marshal(patch)
	var merged []byte
	var err error
	switch patchType {
	case "", "merge", "strategic": // strategic: approximated by a merge patch
		merged, err = jsonpatch.MergePatch(cur, p)
	case "json":
		var jp jsonpatch.Patch
		if jp, err = jsonpatch.DecodePatch(p); err == nil {
			merged, err = jp.Apply(cur)
		}
	default:
		err = fmt.Errorf("patch type %q: use merge, json or strategic", patchType)
	}
	if err != nil {
		err = apierrors.NewBadRequest(err.Error())
		k.record(c, err)
		return nil, err
	}
	var out map[string]any
	_ = json.Unmarshal(merged, &out)
	k.stamp(out)
	k.objects[key] = out
	k.record(c, nil)
	return copyJSON(out).(map[string]any), nil
}

func (k *fakeKube) Delete(_ context.Context, apiVersion, kind, ns, name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := objectKey(apiVersion, kind, ns, name)
	var err error
	if _, ok := k.objects[key]; !ok {
		err = apierrors.NewNotFound(groupResource(apiVersion, kind), name)
	}
	delete(k.objects, key)
	k.record(Call{Verb: "delete", APIVersion: apiVersion, Kind: kind, Namespace: ns, Name: name}, err)
	return err
}

// Apply is server-side apply approximated: the object is created, or merged into
// the existing one (fields it does not give are kept).
func (k *fakeKube) Apply(_ context.Context, obj map[string]any, _ bool) (map[string]any, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	av, kind, ns, name := state.Identity(obj)
	key := objectKey(av, kind, ns, name)
	out := copyJSON(obj).(map[string]any)
	if cur, ok := k.objects[key]; ok {
		a, _ := json.Marshal(cur)
		b, _ := json.Marshal(obj)
		merged, err := jsonpatch.MergePatch(a, b)
		if err == nil {
			out = nil
			_ = json.Unmarshal(merged, &out)
		}
	}
	k.stamp(out)
	k.objects[key] = out
	k.record(Call{Verb: "apply", APIVersion: av, Kind: kind, Namespace: ns, Name: name, Body: copyJSON(obj)}, nil)
	return copyJSON(out).(map[string]any), nil
}

func (k *fakeKube) Event(_ context.Context, obj map[string]any, eventType, reason, message string) error {
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("an event needs a reason")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.events = append(k.events, Event{Type: eventType, Reason: reason, Message: message})
	return nil
}
