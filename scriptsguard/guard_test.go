package scriptsguard

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/luabind"
)

const goodScript = `local luaop = require("luaop")
local greeting = require("lib.greeting")
luaop.on.create("v1/configmaps", function(ctx) return greeting.hello(ctx.name) end, { id = "hello" })
`

const goodModule = `local M = {}
function M.hello(name) return "hello " .. name end
return M
`

// The webhook of the scripts ConfigMap: what a user's `kubectl apply` would be told.
func TestScriptsGuardRejectsScriptsThatDoNotLoad(t *testing.T) {
	h := ScriptsGuard("luaop-system", "luaop-scripts", slog.New(slog.NewTextHandler(io.Discard, nil)), luabind.Options{})
	if h.FailurePolicy != "Ignore" || h.Path() != "/validate/"+scriptsGuardID {
		t.Errorf("failure policy %q, path %q", h.FailurePolicy, h.Path())
	}
	cm := func(data map[string]any) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "data": data}
	}
	for _, tt := range []struct {
		name      string
		ns, cm    string
		data      map[string]any
		wantAllow bool
		want      []string // in the rejection message
	}{
		{"scripts that load", "luaop-system", "luaop-scripts", map[string]any{"hello.lua": goodScript, "lib__greeting.lua": goodModule}, true, nil},
		{"syntax error", "luaop-system", "luaop-scripts", map[string]any{"hello.lua": goodScript, "lib__greeting.lua": goodModule, "bad.lua": "local x = \nlocal luaop = (\n"},
			false, []string{"bad.lua:", "luaop-system/luaop-scripts"}},
		{"unknown option", "luaop-system", "luaop-scripts", map[string]any{"a.lua": "local luaop = require(\"luaop\")\n\nluaop.on.create(\"v1/pods\", function() end, { id = \"a\", retires = 3 })\n"},
			false, []string{"a.lua:3", "retires"}},
		{"duplicate id", "luaop-system", "luaop-scripts", map[string]any{"a.lua": "local luaop = require(\"luaop\")\nluaop.on.create(\"v1/pods\", function() end, { id = \"x\" })\nluaop.on.update(\"v1/pods\", function() end, { id = \"x\" })\n"},
			false, []string{"a.lua:3", "duplicate handler id"}},
		{"missing module", "luaop-system", "luaop-scripts", map[string]any{"hello.lua": goodScript}, false, []string{"hello.lua:2", "lib.greeting"}},
		{"no scripts", "luaop-system", "luaop-scripts", map[string]any{"notes.txt": "x"}, false, []string{"no *.lua key"}},
		{"another ConfigMap", "luaop-system", "other", map[string]any{"bad.lua": "("}, true, nil},
		{"another namespace", "default", "luaop-scripts", map[string]any{"bad.lua": "("}, true, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := h.Admit(t.Context(), admission.Request{Operation: "UPDATE", Namespace: tt.ns, Name: tt.cm, Object: cm(tt.data)})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Allowed != tt.wantAllow {
				t.Fatalf("allowed %v, want %v (message %q)", resp.Allowed, tt.wantAllow, resp.Message)
			}
			for _, w := range tt.want {
				if !strings.Contains(resp.Message, w) {
					t.Errorf("message %q lacks %q", resp.Message, w)
				}
			}
		})
	}
}
