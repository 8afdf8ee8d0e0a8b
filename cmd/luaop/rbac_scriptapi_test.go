package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/luaop/luaop/scriptapi"
)

// luaop rbac grants every function of scriptapi's table the access the table gives
// it: a verb added to the table (and so to the runtime, the stubs and luaop check)
// is granted here too, or this fails.
func TestRBACGrantsTheAccessOfEveryFunction(t *testing.T) {
	for _, f := range scriptapi.Functions {
		if f.Access.Target == scriptapi.NoCluster {
			continue
		}
		t.Run(f.Name, func(t *testing.T) {
			args := make([]string, len(f.Params))
			for i := range args {
				args[i] = `"x"`
			}
			switch f.Access.Target {
			case scriptapi.ByKind:
				args[0], args[1] = `"v1"`, `"Secret"`
			case scriptapi.ByResource:
				args[0] = `"v1/secrets"`
			case scriptapi.ByObject, scriptapi.CoreEvents:
				args[0] = `{apiVersion = "v1", kind = "Secret", metadata = {name = "x"}}`
			default:
				t.Fatalf("luaop rbac does not know the access target %d of luaop.%s", f.Access.Target, f.Name)
			}
			dir := t.TempDir()
			src := fmt.Sprintf("local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function(ctx)\n  luaop.%s(%s)\nend)\n", f.Name, strings.Join(args, ", "))
			if err := os.WriteFile(filepath.Join(dir, "a.lua"), []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			out, stderr, err := runCLI(t, "rbac", dir)
			if err != nil || stderr != "" {
				t.Fatalf("luaop rbac: %v\n%s", err, stderr)
			}
			var verbs []string
			for _, v := range verbOrder {
				if slices.Contains(f.Access.Verbs, v) {
					verbs = append(verbs, v)
				}
			}
			if len(verbs) != len(f.Access.Verbs) {
				t.Fatalf("luaop.%s needs verbs %v, some of which luaop rbac does not order (verbOrder)", f.Name, f.Access.Verbs)
			}
			resource := "secrets"
			if f.Access.Target == scriptapi.CoreEvents {
				resource = "events"
			}
			if f.Access.Subresource != "" {
				resource += "/" + f.Access.Subresource
			}
			want := fmt.Sprintf("- apiGroups: [\"\"]\n  resources: [%s]\n  verbs: [%s]\n", resource, strings.Join(verbs, ", "))
			if !strings.Contains(out, want) {
				t.Errorf("luaop.%s: the RBAC lacks\n%s---\n%s", f.Name, want, out)
			}
		})
	}
}

// The rules of one API group whose verb lists are as long (create, delete) come in
// one order: the output is the same on every run, as "run it again" needs.
func TestRBACOutputIsTheSameOnEveryRun(t *testing.T) {
	dir := t.TempDir()
	src := `local luaop = require("luaop")
luaop.on.create("v1/configmaps", function(ctx)
  luaop.kube.create({apiVersion = "v1", kind = "Secret", metadata = {}})
  luaop.kube.delete("v1", "Pod", "ns", "x")
  luaop.kube.patch("v1", "Service", "ns", "x", {})
end)
`
	if err := os.WriteFile(filepath.Join(dir, "a.lua"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	first, _, err := runCLI(t, "rbac", dir)
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if out, _, _ := runCLI(t, "rbac", dir); out != first {
			t.Fatalf("two runs differ:\n%s", lineDiff(first, out))
		}
	}
	if i, j := strings.Index(first, "verbs: [create]"), strings.Index(first, "verbs: [delete]"); i < 0 || j < i {
		t.Errorf("create's rule must come before delete's:\n%s", first)
	}
}
