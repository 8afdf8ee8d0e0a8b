package scriptcheck

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/luaop/luaop/scriptapi"
)

// argsOf writes literal arguments for a call of f: a resource, a ConfigMap by kind
// or as an object, a function, empty options.
func argsOf(f scriptapi.Function, resource string) string {
	var args []string
	for i, p := range f.Params {
		switch {
		case p == "resource":
			args = append(args, fmt.Sprintf("%q", resource))
		case p == "fn":
			args = append(args, "function(ctx) end")
		case p == "opts":
			args = append(args, "{}")
		case f.Access.Target == scriptapi.ByKind && i == 0:
			args = append(args, `"v1"`)
		case f.Access.Target == scriptapi.ByKind && i == 1:
			args = append(args, `"ConfigMap"`)
		case i == 0:
			args = append(args, `{apiVersion = "v1", kind = "ConfigMap", metadata = {name = "x"}}`)
		default:
			args = append(args, `"x"`)
		}
	}
	return strings.Join(args, ", ")
}

// The analyser knows every function of scriptapi's table that it must: each
// registration function's resource and options, each luaop.kube call by kind or by
// object (resolved, for luaop rbac), each helper that returns its object.
func TestAnalyserKnowsTheTableOfFunctions(t *testing.T) {
	for _, f := range scriptapi.Functions {
		switch {
		case f.Registers != "":
			if !slices.Contains(scriptapi.HandlerKinds, f.Registers) {
				t.Errorf("luaop.%s registers %q, which is not in scriptapi.HandlerKinds", f.Name, f.Registers)
			}
			src := fmt.Sprintf("local luaop = require('luaop')\nluaop.%s(%s)\n", f.Name, argsOf(f, "widgets"))
			if f.Param("opts") >= 0 {
				src = strings.Replace(src, "{}", "{ bogus = 1 }", 1)
			}
			a := Analyze(scriptsOf("r.lua", src))
			if len(a.Registrations) != 1 || a.Registrations[0].Function != f.Name {
				t.Errorf("luaop.%s: registrations %+v", f.Name, a.Registrations)
			}
			var got []string
			for _, p := range a.Problems {
				got = append(got, p.Message)
			}
			joined := strings.Join(got, "\n")
			if f.Param("resource") >= 0 && !strings.Contains(joined, `resource "widgets"`) {
				t.Errorf("luaop.%s: its bad resource not reported: %q", f.Name, got)
			}
			if f.Param("opts") >= 0 && !strings.Contains(joined, "unknown handler option bogus") {
				t.Errorf("luaop.%s: its options not read: %q", f.Name, got)
			}
		case f.Access.Target == scriptapi.ByKind || f.Access.Target == scriptapi.ByObject || f.Access.Target == scriptapi.ByResource:
			resource, kind := "", "ConfigMap"
			if f.Access.Target == scriptapi.ByResource {
				resource, kind = "v1/configmaps", "configmaps"
			}
			a := Analyze(scriptsOf("k.lua", fmt.Sprintf("local luaop = require('luaop')\nluaop.%s(%s)\n", f.Name, argsOf(f, resource))))
			want := KubeCall{File: "k.lua", Line: 2, Verb: strings.TrimPrefix(f.Name, "kube."), APIVersion: "v1", Kind: kind, Resolved: true}
			if len(a.KubeCalls) != 1 || a.KubeCalls[0] != want {
				t.Errorf("luaop.%s: kube calls %+v, want %+v", f.Name, a.KubeCalls, want)
			}
		}
		if f.ReturnsObject {
			src := fmt.Sprintf("local luaop = require('luaop')\nluaop.kube.create(luaop.%s(%s))\n", f.Name, argsOf(f, ""))
			if a := Analyze(scriptsOf("o.lua", src)); len(a.KubeCalls) != 1 || !a.KubeCalls[0].Resolved || a.KubeCalls[0].Kind != "ConfigMap" {
				t.Errorf("luaop.%s returns its object, but the analyser does not follow it: %+v", f.Name, a.KubeCalls)
			}
		}
	}
}

// Every handler option of the table is known to the rule of which registrations it
// applies to.
func TestOptionRulesKnowEveryOption(t *testing.T) {
	create, _ := scriptapi.Lookup("on.create")
	for _, opt := range scriptapi.HandlerOptions {
		if _, _, known := optionApplies(opt, create); !known {
			t.Errorf("option %s: optionApplies does not say which registrations it applies to", opt)
		}
	}
}
