package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/scripttest"
)

// luaop init writes a scaffold that passes luaop check and luaop test as written,
// with editor support and an overlay pinned to the release, and refuses to overwrite.
func TestInitScaffoldPassesCheckAndTest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my-operator")
	out, _, err := runCLI(t, "init", dir)
	if err != nil {
		t.Fatalf("luaop init: %v\n%s", err, out)
	}
	scripts := filepath.Join(dir, "scripts")
	if out, _, err := runCLI(t, "check", scripts); err != nil || !strings.HasPrefix(out, "ok: 2 file(s), 1 handler(s)") {
		t.Errorf("luaop check of the scaffold: %v\n%s", err, out)
	}
	out, _, err = runCLI(t, "test", "-v", scripts)
	if err != nil || !strings.Contains(out, "ok    3 case(s) passed") {
		t.Errorf("luaop test of the scaffold: %v\n%s", err, out)
	}
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	ks := read("kustomization.yaml")
	for _, want := range []string{"deploy/base?ref=" + releaseVersion, "newTag: " + releaseVersion, "- scripts/hello.lua", "- lib__greeting.lua=scripts/lib/greeting.lua", "- rbac.yaml"} {
		if !strings.Contains(ks, want) {
			t.Errorf("kustomization.yaml lacks %q:\n%s", want, ks)
		}
	}
	rbac := read("rbac.yaml")
	if !strings.Contains(rbac, "resources: [configmaps]\n  verbs: [get, list, watch, patch]") || strings.Contains(rbac, "configmaps/status") || strings.Contains(rbac, dir) {
		t.Errorf("rbac.yaml: want the watched ConfigMaps, no configmaps/status, no absolute path:\n%s", rbac)
	}
	// The RBAC of luaop run's defaults (issue 44): secure metrics authenticate and
	// authorize the scrapers through the API server, so the operator may create
	// TokenReviews and SubjectAccessReviews; the header is luaop rbac's own command.
	for _, want := range []string{"resources: [tokenreviews]\n  verbs: [create]", "resources: [subjectaccessreviews]\n  verbs: [create]", "#   luaop rbac --leader-elect --scripts-configmap luaop-scripts scripts\n"} {
		if !strings.Contains(rbac, want) {
			t.Errorf("rbac.yaml lacks %q:\n%s", want, rbac)
		}
	}
	if strings.Contains(rbac, "--metrics-auth=false") {
		t.Errorf("rbac.yaml is made for --metrics-auth=false, luaop run serves secure metrics:\n%s", rbac)
	}
	// A ConfigMap has no status: the scaffold's handler returns no result (it would
	// be status.greet, which the API server drops: a StatusPruned warning).
	if strings.Contains(read("scripts/hello.lua"), "return {") {
		t.Errorf("the scaffold's handler returns a result, which a ConfigMap cannot keep:\n%s", read("scripts/hello.lua"))
	}
	var luarc map[string]any
	if err := json.Unmarshal([]byte(read("scripts/.luarc.json")), &luarc); err != nil || luarc["runtime.version"] != "Lua 5.1" {
		t.Errorf(".luarc.json: %v %v", err, luarc["runtime.version"])
	}
	if !strings.HasPrefix(read("scripts/tests/hello.yaml"), scripttest.SchemaModeline("luaop-test.schema.json")) || read("scripts/tests/luaop-test.schema.json") != scripttest.Schema() {
		t.Error("the test file does not point yaml-language-server at the schema next to it")
	}
	if _, _, err := runCLI(t, "init", dir); err == nil || exitCode(err) != exitUsage || !strings.Contains(err.Error(), "--force") {
		t.Errorf("a second luaop init: %v; want a usage error suggesting --force", err)
	}
}

// The example tests point yaml-language-server at the schema, whose committed copy is
// the one luaop writes.
func TestExampleTestsSchemaIsCurrent(t *testing.T) {
	root := filepath.Join("..", "..", "scripts", "examples", "tests")
	b, err := os.ReadFile(filepath.Join(root, "luaop-test.schema.json"))
	if err != nil || string(b) != scripttest.Schema() {
		t.Fatalf("scripts/examples/tests/luaop-test.schema.json is not luaop's schema (%v): luaop stubs --schema scripts/examples/tests/luaop-test.schema.json", err)
	}
	files, _ := scripttest.Files(root)
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if !strings.HasPrefix(string(data), scripttest.SchemaModeline("luaop-test.schema.json")) {
			t.Errorf("%s does not start with %q", f, strings.TrimSpace(scripttest.SchemaModeline("luaop-test.schema.json")))
		}
	}
}
