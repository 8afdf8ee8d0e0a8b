package scripttest

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeAPIScripts are handlers whose outcome the API server, not the handler, decides.
const fakeAPIScripts = `local luaop = require("luaop")
-- The old luaop init scaffold: a result of a ConfigMap handler lands in status.<id>,
-- which a ConfigMap does not keep.
luaop.on.create("v1/configmaps", function(ctx) return {keys = 1} end, {id = "greet"})
luaop.on.create("examples.luaop.dev/v1/gadgets", function(ctx) return {ok = true} end, {id = "gadget"})
luaop.on.create("v1/configmaps", function(ctx)
  local _, err = luaop.kube.create({apiVersion = "examples.luaop.dev/v1", kind = "Gadget",
    metadata = {name = ctx.name, namespace = ctx.namespace}, spec = {size = ctx.body.data.size}})
  if err ~= nil then error(luaop.permanent_error(err)) end
  ctx.patch.metadata.annotations = {made = "yes"}
end, {id = "make"})
-- A failure path: the error of a create is handled (a 409 is fine: it exists).
luaop.on.create("examples.luaop.dev/v1/gadgets", function(ctx)
  local cm, err = luaop.kube.create({apiVersion = "v1", kind = "ConfigMap",
    metadata = {name = ctx.name .. "-cm", namespace = ctx.namespace}})
  if err ~= nil and err:find("already exists", 1, true) then return {existed = true} end
  if err ~= nil then error(luaop.temporary_error("cannot create the ConfigMap: " .. err, 7)) end
  return {created = cm.metadata.name}
end, {id = "owned"})
`

const gadgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.examples.luaop.dev}
spec:
  group: examples.luaop.dev
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer, minimum: 1}}}
          status:
            type: object
            properties:
              owned: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

func runFakeAPICase(t *testing.T, c string) (bool, string) {
	t.Helper()
	return runFakeAPIFile(t, "cases:\n- "+strings.ReplaceAll(c, "\n", "\n  ")+"\n")
}

// runFakeAPIFile runs a whole test file beside fakeAPIScripts and gadgets.yaml.
func runFakeAPIFile(t *testing.T, file string) (bool, string) {
	t.Helper()
	dir := t.TempDir()
	for name, content := range map[string]string{"h.lua": fakeAPIScripts, "gadgets.yaml": gadgetCRD, "cases.yaml": file} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out strings.Builder
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: []string{filepath.Join(dir, "cases.yaml")}, Out: &out})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return sum.Failed == 0, out.String()
}

// What the API server would drop fails the case with the operator's own words
// (StatusPruned), and a write the server refuses is refused offline too.
func TestCaseFailsWhatTheServerPrunes(t *testing.T) {
	const gadget = "object: {apiVersion: examples.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {size: 2}}\n"
	for _, tc := range []struct {
		name, c string
		pass    bool
		out     string
	}{
		{name: "a ConfigMap keeps no status", c: "handler: greet\nobject: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: ns}}\nexpect: {result: {keys: 1}}",
			out: "StatusPruned (a Warning Event on a cluster): the server dropped status.greet of ConfigMap: its schema does not keep it"},
		{name: "a CRD's schema prunes an undeclared status field", c: "handler: gadget\ncrds: [gadgets.yaml]\n" + gadget + "expect: {result: {ok: true}}",
			out: "the server dropped status.gadget of Gadget"},
		{name: "without the CRD the custom resource is stored as given", c: "handler: gadget\n" + gadget + "expect: {result: {ok: true}}", pass: true},
		{name: "a field the schema declares is kept", c: "handler: owned\ncrds: [gadgets.yaml]\n" + gadget + "expect: {result: {created: g-cm}}", pass: true},
		{name: "the schema refuses a created object", c: "handler: make\ncrds: [gadgets.yaml]\nobject: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: ns}, data: {size: 0}}\nexpect: {patch: {metadata: {annotations: {made: \"yes\"}}}}",
			out: `Gadget.examples.luaop.dev \"c\" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1`},
		{name: "the schema refuses a string where an integer is", c: "handler: make\ncrds: [gadgets.yaml]\nobject: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: ns}, data: {size: \"2\"}}\nexpect: {error: {type: permanent, message: 'spec.size: Invalid value: \"string\": spec.size in body must be of type integer'}}", pass: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pass, out := runFakeAPICase(t, tc.c)
			if pass != tc.pass {
				t.Fatalf("passed: %v, want %v\n%s", pass, tc.pass, out)
			}
			if !tc.pass && !strings.Contains(out, tc.out) {
				t.Errorf("output lacks %q:\n%s", tc.out, out)
			}
		})
	}
}

// A file's crds: serve every case of the file, before each case's own.
func TestFileCRDsServeEveryCase(t *testing.T) {
	const gadgetCase = "- handler: gadget\n  object: {apiVersion: examples.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {size: 2}}\n  expect: {result: {ok: true}}\n"
	pass, out := runFakeAPIFile(t, "crds: [gadgets.yaml]\ncases:\n"+gadgetCase+gadgetCase)
	if pass || strings.Count(out, "the server dropped status.gadget of Gadget") != 2 {
		t.Errorf("both cases must fail as the CRD's schema prunes status.gadget:\n%s", out)
	}
	_, err := Run(t.Context(), Options{Scripts: t.TempDir(), Tests: []string{writeTemp(t, "crds: gadgets.yaml\ncases: []\n")}, Out: io.Discard})
	if err == nil || !strings.Contains(err.Error(), ":1: crds: must be a list of CustomResourceDefinition files") {
		t.Errorf("a crds: that is not a list: err %v, want file:line and what to write", err)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cases.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// fail: injects the API server's errors into a case's luaop.kube calls, so a
// handler's error paths are tested offline; the calls show the code and that the
// failure was injected.
func TestCaseFailInjection(t *testing.T) {
	const owned = "handler: owned\ncrds: [gadgets.yaml]\nobject: {apiVersion: examples.luaop.dev/v1, kind: Gadget, metadata: {name: g, namespace: ns}, spec: {size: 2}}\n"
	for _, tc := range []struct {
		name, c string
		pass    bool
		out     string
	}{
		{name: "409 on create is handled", pass: true, c: owned + "fail: [{verb: create, resource: configmaps, code: 409}]\nexpect:\n  result: {existed: true}\n  kube: [{verb: create, kind: ConfigMap, name: g-cm, code: 409, injected: true}]\n  objects: []"},
		{name: "403 is a temporary error", pass: true, c: owned + "fail: [{verb: create, resource: ConfigMap, name: g-cm, code: 403}]\nexpect:\n  error: {type: temporary, message: 'cannot create resource \"configmaps\" in API group \"\" in the namespace \"ns\"', delay: 7}\n  kube: [{verb: create, code: 403, injected: true}]"},
		{name: "422 is a temporary error", pass: true, c: owned + "fail: [{verb: create, resource: configmaps, code: 422, message: names must be short}]\nexpect:\n  error: {type: temporary, message: names must be short}"},
		{name: "500 is a temporary error", pass: true, c: owned + "fail: [{verb: create, code: 500}]\nexpect:\n  error: {type: temporary, message: an error on the server}"},
		{name: "times: the next call succeeds", pass: true, c: owned + "fail: [{verb: get, code: 500, times: 1}]\nexpect:\n  result: {created: g-cm}\n  objects: [{apiVersion: v1, kind: ConfigMap, metadata: {name: g-cm, namespace: ns}}]"},
		{name: "an unexpected failure fails the case", c: owned + "fail: [{verb: create, code: timeout}]\nexpect:\n  result: {created: g-cm}", out: "request did not complete within requested timeout"},
		{name: "a bad code is refused", c: owned + "fail: [{verb: create, code: 418}]\nexpect: {}", out: "fail: code 418: use one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pass, out := runFakeAPICase(t, tc.c)
			if pass != tc.pass {
				t.Fatalf("passed: %v, want %v\n%s", pass, tc.pass, out)
			}
			if !tc.pass && !strings.Contains(out, tc.out) {
				t.Errorf("output lacks %q:\n%s", tc.out, out)
			}
		})
	}
}
