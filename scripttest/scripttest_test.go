package scripttest

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func repoRoot(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

// The example scripts' own test cases pass (CI runs them here).
func TestExampleCases(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "scripts", "examples")
	files, err := Files(filepath.Join(dir, "tests"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	var out bytes.Buffer
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: files, Out: &out, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failed > 0 || sum.Passed < 15 {
		t.Fatalf("%+v\n%s", sum, out.String())
	}
}

// Failing cases say what differs, as a diff of YAML, what error came instead of
// the one expected, and which calls were made.
func TestFailingCasesReadably(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("h.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/things", function(ctx)
  if ctx.spec.fail then error(luaop.temporary_error("not yet", 7)) end
  luaop.kube.create({ apiVersion = "v1", kind = "ConfigMap", metadata = { name = ctx.name, namespace = ctx.namespace } })
  return { size = ctx.spec.size * 2 }
end, { id = "double" })
`)
	write("cases.yaml", `cases:
- name: right
  handler: double
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 2}}
  expect:
    status: {double: {size: 4}}
    kube: [{verb: create, kind: ConfigMap, name: a}]
- name: wrong result
  handler: double
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 2}}
  expect:
    status: {double: {size: 5}}
    kube: [{verb: apply, kind: ConfigMap, name: a}]
- name: wrong delay
  handler: double
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a}, spec: {fail: true}}
  expect:
    error: {type: temporary, delay: 5}
- name: no error expected
  handler: double
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a}, spec: {fail: true}}
  expect: {}
- name: unknown handler
  handler: triple
  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a}}
  expect: {}
`)
	var out bytes.Buffer
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: []string{filepath.Join(dir, "cases.yaml")}, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Passed != 1 || sum.Failed != 4 {
		t.Errorf("summary %+v", sum)
	}
	got := regexp.MustCompile(`\(\d+ms\)`).ReplaceAllString(out.String(), "(Xms)")
	for _, want := range []string{
		"FAIL  cases.yaml/wrong result (Xms)\n    status (of the patch): (-want +got)\n      double:\n    -   size: 5\n    +   size: 4\n",
		"    luaop.kube calls: (-want +got)\n      - kind: ConfigMap\n        name: a\n    -   verb: apply\n    +   verb: create\n",
		"FAIL  cases.yaml/wrong delay (Xms)\n    error delay: want 5s, got 7s\n    (the error: temporary error \"not yet\", retry in 7s)\n",
		"FAIL  cases.yaml/no error expected (Xms)\n    unexpected error: temporary error \"not yet\", retry in 7s\n",
		"FAIL  cases.yaml/unknown handler (Xms)\n    no handler \"triple\"; the scripts register double\n",
		"FAIL  4 of 5 case(s) failed",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks\n%s\n--- output:\n%s", want, got)
		}
	}
	if strings.Contains(got, "cases.yaml/right") {
		t.Errorf("a passing case is printed without Verbose:\n%s", got)
	}
}
