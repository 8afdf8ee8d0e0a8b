package scripttest

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/scripttest/fakeapi"
	"github.com/luaop/luaop/state"
)

// caseServer is the fake API server of a case (package fakeapi: the API server's
// own validation, pruning, defaulting, server-side apply and patches): it holds the
// case's objects, serves the custom resources of its crds: files (relative to the
// test file's folder dir) with their schemas, and refuses the calls of its fail:
// list.
func caseServer(dir string, c Case) (*fakeapi.Server, error) {
	paths := make([]string, len(c.CRDs))
	for i, p := range c.CRDs {
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		paths[i] = p
	}
	crds, err := fakeapi.ReadCRDs(paths...)
	if err != nil {
		return nil, fmt.Errorf("crds: %w", err)
	}
	return fakeapi.New(fakeapi.Options{CRDs: crds, Objects: c.Objects, Failures: c.Fail})
}

// checkFake compares the events, luaop.kube calls and objects of the fake API.
func checkFake(e Expect, kube *fakeapi.Server) []string {
	var failures []string
	if e.Given("events") {
		compare(&failures, "events", emptyListIfNil(e.Events), normalize(kube.Events()))
	}
	if e.Given("kube") {
		compare(&failures, "luaop.kube calls", emptyListIfNil(e.Kube), normalize(kube.Calls()))
	}
	if held := kube.Objects(); e.Given("objects") && len(e.Objects) == 0 && len(held) > 0 {
		var names []string
		for _, o := range held {
			av, kind, ns, name := state.Identity(o)
			names = append(names, fmt.Sprintf("%s %s %s/%s", av, kind, ns, name))
		}
		sort.Strings(names)
		failures = append(failures, fmt.Sprintf("want the fake API to hold no objects (objects: []), it holds %s", strings.Join(names, ", ")))
	}
	for _, want := range e.Objects {
		av, kind, ns, name := state.Identity(want)
		got, ok := kube.Object(av, kind, ns, name)
		if !ok {
			failures = append(failures, fmt.Sprintf("the fake API holds no %s %s %s/%s", av, kind, ns, name))
			continue
		}
		compare(&failures, fmt.Sprintf("object %s %s/%s in the fake API", kind, ns, name), normalize(want), normalize(got))
	}
	return failures
}

// checkOperatorWrite sends the handlers' patch of obj to the fake API as the
// operator writes it (the status to the status subresource where the kind has
// one) and fails the case as the operator would complain on a cluster: a status
// field the server drops is the operator's StatusPruned, in its words. It runs
// after checkFake, on the objects the case's expectations did not see.
func checkOperatorWrite(ctx context.Context, kube *fakeapi.Server, obj map[string]any, patch any) []string {
	p, _ := patch.(map[string]any)
	if obj == nil || len(p) == 0 {
		return nil
	}
	_, dropped, err := kube.OperatorWrite(ctx, obj, p)
	if err != nil {
		return []string{"the operator's write of the handlers' outcome is refused by the API server: " + describeError(err)}
	}
	kind, _ := obj["kind"].(string)
	var failures []string
	for _, f := range dropped {
		failures = append(failures, "StatusPruned (a Warning Event on a cluster): "+handling.StatusPrunedMessage(strings.TrimPrefix(f, "status."), kind))
	}
	return failures
}

// defaultNamespace puts a case's object of a namespaced kind in the namespace
// "default" when it names none, as kubectl does: on a cluster the object a handler
// sees always has its namespace, and what the handler builds from it (an owned
// object in the same namespace) is refused by the API server without one.
func defaultNamespace(kube *fakeapi.Server, obj map[string]any) {
	av, kind, ns, _ := state.Identity(obj)
	if kind == "" || ns != "" || !kube.Namespaced(av, kind) {
		return
	}
	obj["metadata"].(map[string]any)["namespace"] = "default"
}
