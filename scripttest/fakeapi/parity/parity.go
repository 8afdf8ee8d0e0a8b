package parity

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/luaop/luaop/luabind"
)

// CRD is the CustomResourceDefinition the table's custom resources need
// (Gadget, parity.luaop.dev/v1): a schema with required fields, types, an enum, a
// pattern, a default, a CEL rule, a transition rule, a map list, and a status
// subresource.
//
//go:embed gadgets.yaml
var CRD []byte

// Step is one request.
type Step struct {
	Title string
	// As is the field manager (default "luaop", luaop's client's).
	As   string
	Verb string // get, list, create, patch, delete, apply
	// APIVersion, Kind, Name: the object (the namespace is the run's).
	APIVersion, Kind, Name string
	Object                 map[string]any // create, apply
	Patch                  any
	PatchType              string // merge, json, strategic
	Force                  bool
	Selector               string
}

// Answer is what a request got, reduced to what both servers give alike: the
// status code, reason and message of a refusal, or the object (without uid,
// timestamps, resourceVersion and managedFields' times; the resourceVersion is
// told as changed or not since the object's last answer), or a list's names.
type Answer struct {
	Step    string
	Code    int            `json:",omitempty"`
	Reason  string         `json:",omitempty"`
	Message string         `json:",omitempty"`
	Object  map[string]any `json:",omitempty"`
	Names   []string       `json:",omitempty"`
}

// Run sends the table's requests, in order, through kube (as returns the client
// writing as a field manager) in namespace ns, and returns the answers.
func Run(ctx context.Context, as func(manager string) luabind.Kube, ns string) []Answer {
	var out []Answer
	versions := map[string]string{}
	for _, st := range Steps(ns) {
		manager := st.As
		if manager == "" {
			manager = "luaop"
		}
		k := as(manager)
		a := Answer{Step: st.Title}
		var obj map[string]any
		var items []map[string]any
		var err error
		switch st.Verb {
		case "get":
			obj, err = k.Get(ctx, st.APIVersion, st.Kind, ns, st.Name)
		case "list":
			items, err = k.List(ctx, st.APIVersion, st.Kind, ns, st.Selector)
		case "create":
			obj, err = k.Create(ctx, st.Object)
		case "patch":
			obj, err = k.Patch(ctx, st.APIVersion, st.Kind, ns, st.Name, st.Patch, st.PatchType)
		case "delete":
			err = k.Delete(ctx, st.APIVersion, st.Kind, ns, st.Name)
		case "apply":
			obj, err = k.Apply(ctx, st.Object, st.Force)
		}
		var status apierrors.APIStatus
		switch {
		case errors.As(err, &status):
			a.Code, a.Reason, a.Message = int(status.Status().Code), string(status.Status().Reason), status.Status().Message
		case err != nil:
			a.Message = err.Error()
		case st.Verb == "list":
			a.Names = []string{}
			for _, it := range items {
				m, _ := it["metadata"].(map[string]any)
				a.Names = append(a.Names, fmt.Sprint(m["name"]))
			}
			sort.Strings(a.Names)
		case obj != nil:
			a.Object = reduce(obj, versions)
		}
		out = append(out, a)
	}
	return out
}

// reduce drops what differs between two servers by nature and tells the
// resourceVersion as changed or kept.
func reduce(obj map[string]any, versions map[string]string) map[string]any {
	obj = runtime.DeepCopyJSON(obj)
	m, _ := obj["metadata"].(map[string]any)
	if m == nil {
		return obj
	}
	key := fmt.Sprint(obj["kind"], "/", m["name"])
	rv, _ := m["resourceVersion"].(string)
	if prev, seen := versions[key]; seen && prev == rv {
		m["resourceVersion"] = "kept"
	} else {
		m["resourceVersion"] = "new"
	}
	versions[key] = rv
	delete(m, "uid")
	delete(m, "creationTimestamp")
	if _, ok := m["deletionTimestamp"]; ok {
		m["deletionTimestamp"] = "set"
	}
	if mf, ok := m["managedFields"].([]any); ok {
		for _, e := range mf {
			if em, ok := e.(map[string]any); ok {
				delete(em, "time")
			}
		}
	}
	return obj
}

func cm(ns, name string, data map[string]any, extra map[string]any) map[string]any {
	o := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": ns}}
	if data != nil {
		o["data"] = data
	}
	for k, v := range extra {
		o[k] = v
	}
	return o
}

func gadget(ns, name string, spec map[string]any, meta map[string]any) map[string]any {
	m := map[string]any{"name": name, "namespace": ns}
	for k, v := range meta {
		m[k] = v
	}
	o := map[string]any{"apiVersion": "parity.luaop.dev/v1", "kind": "Gadget", "metadata": m}
	if spec != nil {
		o["spec"] = spec
	}
	return o
}

// Steps are the table's requests in namespace ns.
func Steps(ns string) []Step {
	const G, V = "parity.luaop.dev/v1", "v1"
	type M = map[string]any
	return []Step{
		// Built-in kinds: typed decoding, metadata rules, patches, preconditions.
		{Title: "create a ConfigMap", Verb: "create", Object: cm(ns, "cm1", M{"a": "1"}, nil)},
		{Title: "create it again", Verb: "create", Object: cm(ns, "cm1", M{"a": "1"}, nil)},
		{Title: "a number where a string is", Verb: "create", Object: cm(ns, "cm-number", M{"a": 1}, nil)},
		{Title: "unknown fields and a status are dropped", Verb: "create", Object: cm(ns, "cm-extra", M{"a": "1"}, M{"foo": "bar", "status": M{"greet": M{"keys": 1}}})},
		{Title: "an invalid name", Verb: "create", Object: cm(ns, "Bad_Name", nil, nil)},
		{Title: "a resourceVersion on create", Verb: "create", Object: cm(ns, "cm-rv", nil, M{"metadata": M{"name": "cm-rv", "namespace": ns, "resourceVersion": "5"}})},
		{Title: "get it", Verb: "get", APIVersion: V, Kind: "ConfigMap", Name: "cm1"},
		{Title: "get a missing one", Verb: "get", APIVersion: V, Kind: "ConfigMap", Name: "missing"},
		{Title: "merge patch", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", Patch: M{"data": M{"a": nil, "b": "2"}}},
		{Title: "merge patch changing nothing", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", Patch: M{"data": M{"b": "2"}}},
		{Title: "a stale resourceVersion", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", Patch: M{"metadata": M{"resourceVersion": "1"}, "data": M{"c": "3"}}},
		{Title: "a status on a ConfigMap is dropped", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", Patch: M{"status": M{"greet": M{"keys": 1}}}},
		{Title: "a JSON patch whose test fails", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", PatchType: "json",
			Patch: []any{M{"op": "test", "path": "/data/b", "value": "3"}, M{"op": "add", "path": "/data/c", "value": "3"}}},
		{Title: "a JSON patch", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", PatchType: "json",
			Patch: []any{M{"op": "test", "path": "/data/b", "value": "2"}, M{"op": "add", "path": "/data/c", "value": "3"}}},
		{Title: "a strategic merge patch", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm1", PatchType: "strategic",
			Patch: M{"metadata": M{"labels": M{"app": "x"}}}},
		{Title: "patch a missing one", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "missing", Patch: M{"data": M{"a": "1"}}},
		{Title: "list by label", Verb: "list", APIVersion: V, Kind: "ConfigMap", Selector: "app=x"},
		// Server-side apply of a built-in kind: a manager's fields it stops applying go.
		{Title: "apply a ConfigMap", As: "alice", Verb: "apply", Object: cm(ns, "cm-applied", M{"x": "1", "y": "2"}, nil)},
		{Title: "another manager's merge patch", As: "bob", Verb: "patch", APIVersion: V, Kind: "ConfigMap", Name: "cm-applied", Patch: M{"data": M{"z": "3"}}},
		{Title: "apply without y", As: "alice", Verb: "apply", Object: cm(ns, "cm-applied", M{"x": "1"}, nil)},
		{Title: "apply another's field", As: "alice", Verb: "apply", Object: cm(ns, "cm-applied", M{"x": "1", "z": "4"}, nil)},
		{Title: "apply another's field with force", As: "alice", Verb: "apply", Force: true, Object: cm(ns, "cm-applied", M{"x": "1", "z": "4"}, nil)},
		// A custom resource: its schema, defaults, CEL, status subresource.
		{Title: "create a Gadget", Verb: "create", Object: gadget(ns, "g1", M{"size": 3, "unknown": true}, nil)},
		{Title: "a required field missing", Verb: "create", Object: gadget(ns, "g-required", M{"color": "red"}, nil)},
		{Title: "a string where an integer is", Verb: "create", Object: gadget(ns, "g-type", M{"size": "three"}, nil)},
		{Title: "a value out of the enum", Verb: "create", Object: gadget(ns, "g-enum", M{"size": 1, "color": "purple"}, nil)},
		{Title: "a pattern not matched", Verb: "create", Object: gadget(ns, "g-pattern", M{"size": 1, "code": "ABC"}, nil)},
		{Title: "a minimum", Verb: "create", Object: gadget(ns, "g-minimum", M{"size": -1}, nil)},
		{Title: "a CEL rule", Verb: "create", Object: gadget(ns, "g-cel", M{"size": 20}, nil)},
		{Title: "a status on create is dropped", Verb: "create", Object: func() M {
			o := gadget(ns, "g-status", M{"size": 1}, nil)
			o["status"] = M{"phase": "Ready"}
			return o
		}()},
		{Title: "a strategic merge patch of a custom resource", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", PatchType: "strategic", Patch: M{"spec": M{"size": 4}}},
		{Title: "a spec change counts a generation", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", Patch: M{"spec": M{"size": 5}}},
		{Title: "a label change does not", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", Patch: M{"metadata": M{"labels": M{"a": "b"}}}},
		{Title: "status through the main resource is ignored", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", Patch: M{"status": M{"phase": "Ready"}}},
		{Title: "a patch breaking the CEL rule", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", Patch: M{"spec": M{"max": 4}}},
		{Title: "a transition rule's old value is set", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", Patch: M{"spec": M{"owner": "alice"}}},
		{Title: "a patch breaking the transition rule", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g1", Patch: M{"spec": M{"owner": "bob"}}},
		{Title: "an invalid name of a custom resource", Verb: "create", Object: gadget(ns, "Bad_Gadget", M{"size": 1}, nil)},
		{Title: "a duplicate key in a map list", Verb: "create", Object: gadget(ns, "g-duplicate", M{"size": 1, "items": []any{M{"name": "one"}, M{"name": "one", "value": "2"}}}, nil)},
		// Server-side apply of a custom resource: granular maps and map lists.
		{Title: "apply a Gadget", As: "alice", Verb: "apply", Object: gadget(ns, "g2", M{"size": 1, "tags": M{"a": "x"}, "items": []any{M{"name": "one", "value": "1"}}}, nil)},
		{Title: "another manager applies other keys", As: "bob", Verb: "apply", Object: gadget(ns, "g2", M{"tags": M{"b": "y"}, "items": []any{M{"name": "two"}}}, nil)},
		{Title: "a conflict on another's field", As: "bob", Verb: "apply", Object: gadget(ns, "g2", M{"size": 2}, nil)},
		{Title: "forced", As: "bob", Verb: "apply", Force: true, Object: gadget(ns, "g2", M{"size": 2, "tags": M{"b": "y"}, "items": []any{M{"name": "two"}}}, nil)},
		{Title: "fields no longer applied are removed", As: "alice", Verb: "apply", Object: gadget(ns, "g2", M{"items": []any{M{"name": "one", "value": "1"}}}, nil)},
		{Title: "an invalid apply", As: "alice", Verb: "apply", Object: gadget(ns, "g2", M{"items": []any{M{"name": "one", "value": "1"}}, "color": "purple"}, nil)},
		// Deletion: finalizers hold an object.
		{Title: "create a Gadget with a finalizer", Verb: "create", Object: gadget(ns, "g3", M{"size": 1}, M{"finalizers": []any{"parity.luaop.dev/hold"}})},
		{Title: "delete it", Verb: "delete", APIVersion: G, Kind: "Gadget", Name: "g3"},
		{Title: "it is held", Verb: "get", APIVersion: G, Kind: "Gadget", Name: "g3"},
		{Title: "remove the finalizer", Verb: "patch", APIVersion: G, Kind: "Gadget", Name: "g3", Patch: M{"metadata": M{"finalizers": nil}}},
		{Title: "it is gone", Verb: "get", APIVersion: G, Kind: "Gadget", Name: "g3"},
		{Title: "delete a missing one", Verb: "delete", APIVersion: G, Kind: "Gadget", Name: "g3"},
		{Title: "list the Gadgets", Verb: "list", APIVersion: G, Kind: "Gadget"},
	}
}

// Diff lists the answers that differ, step by step.
func Diff(want, got []Answer, show func(Answer) string) string {
	var b strings.Builder
	for i := range max(len(want), len(got)) {
		var w, g Answer
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if sw, sg := show(w), show(g); sw != sg {
			fmt.Fprintf(&b, "step %d %q:\n  want %s\n   got %s\n", i+1, w.Step+g.Step, sw, sg)
		}
	}
	return b.String()
}

// Canonical is the answers as JSON with the namespace written NS: what the golden
// file holds and what two runs in different namespaces compare by.
func Canonical(answers []Answer, ns string) ([]byte, error) {
	data, err := json.MarshalIndent(answers, "", "  ")
	if err != nil {
		return nil, err
	}
	return []byte(strings.ReplaceAll(string(data), ns, "NS") + "\n"), nil
}

// Show is an answer as compact JSON with the namespace written NS, for Diff.
func Show(ns string) func(Answer) string {
	return func(a Answer) string {
		data, _ := json.Marshal(a)
		return strings.ReplaceAll(string(data), ns, "NS")
	}
}
