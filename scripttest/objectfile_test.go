package scripttest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// objectFile: a relative path is read next to the test file, an absolute one as it
// is (it used to be joined to the test folder too, and was not found).
func TestObjectFileRelativeAndAbsolute(t *testing.T) {
	dir := t.TempDir()
	elsewhere := t.TempDir()
	write := func(path, src string) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "h.lua"), `local luaop = require("luaop")
luaop.on.create("example.com/v1/things", function(ctx)
  return { size = ctx.spec.size }
end, { id = "size" })
`)
	thing := "{apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: %s}}\n"
	write(filepath.Join(dir, "objects", "thing.yaml"), strings.Replace(thing, "%s", "2", 1))
	absolute := filepath.Join(elsewhere, "thing.yaml")
	write(absolute, strings.Replace(thing, "%s", "3", 1))
	tests := filepath.Join(dir, "tests")
	write(filepath.Join(tests, "cases.yaml"), `cases:
- name: relative
  handler: size
  objectFile: ../objects/thing.yaml
  expect:
    status: {size: {size: 2}}
- name: absolute
  handler: size
  objectFile: `+absolute+`
  expect:
    status: {size: {size: 3}}
`)
	files, err := Files(tests)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: files, Out: &out, Verbose: true})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failed != 0 || sum.Passed != 2 {
		t.Fatalf("%+v\n%s", sum, out.String())
	}
}

// The kopf examples' own test cases (scripts/kopf-examples/*/tests) pass.
func TestKopfExampleCases(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(repoRoot(t), "scripts", "kopf-examples", "*", "tests"))
	if len(dirs) == 0 {
		t.Fatal("no tests folder among the kopf examples")
	}
	for _, tests := range dirs {
		files, err := Files(tests)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		sum, err := Run(t.Context(), Options{Scripts: filepath.Dir(tests), Tests: files, Out: &out, Verbose: true})
		if err != nil || sum.Failed > 0 || sum.Passed == 0 {
			t.Errorf("%s: %+v, %v\n%s", tests, sum, err, out.String())
		}
	}
}
