package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/testcluster"
)

func TestTestExamples(t *testing.T) {
	out, _, err := runCLI(t, "test", "-v", filepath.Join(testcluster.RepoRoot(), "scripts", "examples"))
	if err != nil || !strings.Contains(out, "ok    widgets.yaml/greets a new widget") || !strings.Contains(out, "case(s) passed") {
		t.Fatalf("luaop test scripts/examples: %v\n%s", err, out)
	}
}

func TestTestFailureExitsNonZero(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"a.lua":          "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx) return 1 end, {id = 'one'})\n",
		"tests/one.yaml": "cases:\n- name: two\n  handler: one\n  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: x}}\n  expect: {status: {one: 2}}\n",
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, _, err := runCLI(t, "test", dir)
	if err == nil {
		t.Fatalf("want exit status 1:\n%s", out)
	}
	if !strings.Contains(out, "FAIL  one.yaml/two") || !strings.Contains(out, "-   one: 2\n    +   one: 1") && !strings.Contains(out, "- one: 2\n    + one: 1") {
		t.Errorf("output:\n%s", out)
	}
}
