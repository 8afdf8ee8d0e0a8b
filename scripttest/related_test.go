package scripttest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A related case runs the handler with ctx.related as the core builds it, and a
// related object the handler's relations do not relate to the case's object fails
// the case, saying what each relation relates it to: the operator would not run
// the handler for it.
func TestRelatedCases(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("h.lua", `local luaop = require("luaop")
luaop.on.related("example.com/v1/things", function(ctx)
  local seen = {}
  for _, r in ipairs(ctx.related) do seen[#seen + 1] = r.relation .. " " .. r.type .. " " .. r.name end
  return { seen = seen }
end, { id = "watch", owned = "v1/configmaps", labelled = {["v1/secrets"] = "example.com/thing"},
  mapped = {["v1/namespaces"] = function(ctx) return {ctx.labels.thing} end} })
`)
	write("cases.yaml", `cases:
- name: all three
  handler: watch
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns, uid: u-a}}
  related:
  - {type: ADDED, object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: ns, ownerReferences: [{apiVersion: example.com/v1, kind: Thing, name: a, uid: u-a, controller: true}]}}}
  - {object: {apiVersion: v1, kind: Secret, metadata: {name: s, namespace: other, labels: {example.com/thing: ns.a}}}}
  - {type: DELETED, object: {apiVersion: v1, kind: Namespace, metadata: {name: n, labels: {thing: ns/a}}}}
  expect:
    result: {seen: [owned ADDED c, labelled MODIFIED s, mapped DELETED n]}
- name: not related
  cause: related
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}}
  related:
  - {object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c, namespace: ns, ownerReferences: [{apiVersion: example.com/v1, kind: Thing, name: b, controller: true}]}}}
  expect: {}
- name: related without a related handler
  cause: create
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}}
  related:
  - {object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}}
  expect: {}
`)
	var out bytes.Buffer
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: []string{filepath.Join(dir, "cases.yaml")}, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if sum.Passed != 1 || sum.Failed != 2 {
		t.Fatalf("%d passed, %d failed: want the first case to pass, the others to fail\n%s", sum.Passed, sum.Failed, text)
	}
	for _, want := range []string{
		"related[0]: the ConfigMap is not related to ns/a by handler watch, so the operator would not run it for this change: owned v1/configmaps relates it to ns/b",
		"related: applies to cause: related and to handler: cases of luaop.on.related handlers",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the output does not say %q:\n%s", want, text)
		}
	}
}

// An unknown key of a related item is refused at its line.
func TestRelatedCaseKeys(t *testing.T) {
	_, err := decodeFile("x.yaml", []byte("cases:\n- name: a\n  cause: related\n  related:\n  - {objekt: {}}\n"))
	if err == nil || !strings.Contains(err.Error(), `x.yaml:5: unknown key "objekt" in related:`) {
		t.Fatalf("error %v: want the unknown key at its line", err)
	}
}
