package luabind

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 14: luaop check reports, with file:line, what the operator would refuse
// at load and what would only fail (or be ignored) at run time.
func TestCheckReportsEveryProblem(t *testing.T) {
	scripts := []Script{
		{Name: "a.lua", Source: []byte(`local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx)
  local f = io.open("/etc/passwd")
  local home = os.getenv("HOME")
  local t = os.time()
end, { id = "greet", interval = 10 })
luaop.on.update("widgets", function(ctx) end, { id = "u" })
luaop.timer(R, function(ctx) end, { id = "t", interval = 5, optional = true })
luaop.on.delete(R, function(ctx) end, { id = "greet" })
`)},
		{Name: "b.lua", Source: []byte("local x = 7 // 2\n")},
		{Name: "c.lua", Source: []byte("local y <const> = 1\n")},
	}
	rep := Check(t.Context(), scripts, Options{})
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.String())
	}
	want := []string{
		"a.lua:4: io is not available",
		"a.lua:5: os.getenv is not available in luaop's sandbox (its os has clock, date, time)",
		"a.lua:7: luaop.on.create: option interval does not apply here (only to timers)",
		`a.lua:8: luaop.on.update: resource "widgets": write it as`,
		"a.lua:9: luaop.timer: option optional does not apply here (only to on.delete)",
		`a.lua:10: duplicate handler id "greet" (first registered at a.lua:3)`,
		"b.lua:1: '//' (floor division, Lua 5.3) is not Lua 5.1",
		"c.lua:1: local attributes <const>/<close> (Lua 5.4)",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d:\n got %s\nwant %s...", i, got[i], want[i])
		}
	}
}

// What only running the scripts shows (an error raised at load, a timer without
// interval) comes from the real load, with its file and line.
func TestCheckReportsLoadErrors(t *testing.T) {
	rep := Check(t.Context(), []Script{
		{Name: "ok.lua", Source: []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function() end)\n")},
		{Name: "t.lua", Source: []byte("local luaop = require('luaop')\n\nluaop.timer('v1/configmaps', function() end, {id = 'x'})\n")},
	}, Options{})
	if len(rep.Problems) != 1 || rep.Problems[0].File != "t.lua" || rep.Problems[0].Line != 3 ||
		!strings.Contains(rep.Problems[0].Message, "needs an interval or idle") {
		t.Fatalf("problems: %v", rep.Problems)
	}
	rep = Check(t.Context(), []Script{{Name: "ok.lua", Source: []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function() end)\n")}}, Options{})
	if len(rep.Problems) != 0 || len(rep.Handlers) != 1 {
		t.Fatalf("a good script: %+v", rep)
	}
}

// Static resolution of luaop.kube calls (used by luaop rbac): literals, locals,
// and objects built by local functions through luaop.adopt.
func TestAnalyzeKubeCalls(t *testing.T) {
	a := Analyze([]Script{{Name: "k.lua", Source: []byte(`local luaop = require("luaop")
local CM = "ConfigMap"
local function desired(ctx)
  local cm = { apiVersion = "v1", kind = CM, metadata = {} }
  return luaop.adopt(cm)
end
luaop.on.create("v1/secrets", function(ctx)
  luaop.kube.apply(desired(ctx))
  luaop.kube.get("apps/v1", "Deployment", "ns", "n")
  luaop.kube.delete(ctx.spec.apiVersion, ctx.spec.kind, "ns", "n")
end)
`)}})
	if len(a.Problems) != 0 {
		t.Fatalf("problems: %v", a.Problems)
	}
	want := []KubeCall{
		{File: "k.lua", Line: 8, Verb: "apply", APIVersion: "v1", Kind: "ConfigMap", Resolved: true},
		{File: "k.lua", Line: 9, Verb: "get", APIVersion: "apps/v1", Kind: "Deployment", Resolved: true},
		{File: "k.lua", Line: 10, Verb: "delete"},
	}
	if len(a.KubeCalls) != len(want) {
		t.Fatalf("kube calls: %+v", a.KubeCalls)
	}
	for i := range want {
		if a.KubeCalls[i] != want[i] {
			t.Errorf("call %d: got %+v, want %+v", i, a.KubeCalls[i], want[i])
		}
	}
}

// The .luacheckrc lists exactly the sandbox's globals.
func TestLuacheckrc(t *testing.T) {
	rc := Luacheckrc()
	for _, want := range []string{`os = { fields = { "clock", "date", "time" } }`, `"require"`, `std = "luaop"`, `"pairs"`} {
		if !strings.Contains(rc, want) {
			t.Errorf(".luacheckrc lacks %s:\n%s", want, rc)
		}
	}
	for _, absent := range []string{`"io"`, `"coroutine"`, `"dofile"`, `"getenv"`, `"debug"`} {
		if strings.Contains(rc, absent) {
			t.Errorf(".luacheckrc has %s", absent)
		}
	}
}

// With the generated .luacheckrc, luacheck (Debian's lua-check, when installed) flags
// what the sandbox lacks and accepts the example scripts.
func TestLuacheckAgrees(t *testing.T) {
	bin, err := exec.LookPath("luacheck")
	if err != nil {
		t.Skip("luacheck is not installed (Debian: apt-get install lua-check)")
	}
	dir := t.TempDir()
	files := map[string]string{
		".luacheckrc": Luacheckrc(),
		"good.lua":    "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx)\n  return { t = os.time(), s = string.format('%d', 1) }\nend)\n",
		"bad.lua":     "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx)\n  return { home = os.getenv('HOME'), f = io.open('x') }\nend)\n",
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "--no-color", "--codes", ".")
	cmd.Dir = dir
	out, _ := cmd.CombinedOutput()
	for _, want := range []string{"bad.lua:3:19: (W143) accessing undefined field getenv of global os", "bad.lua:3:42: (W113) accessing undefined variable io"} {
		if !strings.Contains(strings.ReplaceAll(string(out), "'", ""), want) {
			t.Errorf("luacheck output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "good.lua:") {
		t.Errorf("luacheck flags good.lua:\n%s", out)
	}
}

// Issue 16: each script has its own globals, so check reports a global read in one
// file and defined only in another, and the sandbox's package and module are gone.
func TestCheckReportsGlobalsOfOtherFiles(t *testing.T) {
	rep := Check(t.Context(), []Script{
		{Name: "a.lua", Source: []byte("PREFIX = 'x'\nlocal function f() return PREFIX end\n")},
		{Name: "b.lua", Source: []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function() return PREFIX end)\nlocal p = package.loaded\n")},
	}, Options{})
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.String())
	}
	want := []string{
		"b.lua:2: PREFIX is a global of a.lua, and each script has its own globals: share it through a module",
		"b.lua:3: package is not available in luaop's sandbox",
		"b.lua:3: attempt to index a non-table object(nil) with key 'loaded'", // the load's own error
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d:\n got %s\nwant %s...", i, got[i], want[i])
		}
	}
}

// Admission handlers: retries/backoff/errors do not apply to them; timeout does
// (the webhook's); the admission options apply to them only.
func TestCheckAdmissionOptions(t *testing.T) {
	rep := Check(t.Context(), []Script{{Name: "a.lua", Source: []byte(`local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx) end, { id = "v", retries = 3, timeout = 5, failure_policy = "Ignore" })
luaop.on.mutate("example.com/v1/widgets", function(ctx) end, { id = "m", operations = "CREATE", side_effects = true, subresource = "status" })
luaop.daemon("example.com/v1/widgets", function(ctx) end, { id = "d", side_effects = true })
`)}}, Options{})
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.String())
	}
	want := []string{
		"a.lua:2: luaop.on.validate: option retries does not apply here",
		"a.lua:4: luaop.daemon: option side_effects does not apply here (only to admission handlers (on.validate, on.mutate))",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d:\n got %s\nwant %s...", i, got[i], want[i])
		}
	}
}

// Every file's load-time error is reported, not only the first the load meets.
func TestCheckReportsEveryLoadError(t *testing.T) {
	scripts := []Script{
		{Name: "a.lua", Source: []byte("local luaop = require('luaop')\nerror('first broken file')\n")},
		{Name: "b.lua", Source: []byte("local luaop = require('luaop')\nlocal x = nil\nlocal y = x.field\n")},
		{Name: "c.lua", Source: []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx) end, {id = 'fine'})\n")},
	}
	rep := Check(t.Context(), scripts, Options{})
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.String())
	}
	joined := strings.Join(got, "\n")
	for _, want := range []string{"a.lua:2: first broken file", "b.lua:3: "} {
		if !strings.Contains(joined, want) {
			t.Errorf("problems:\n%s\nwant one starting %q", joined, want)
		}
	}
	if len(got) != 2 {
		t.Errorf("problems:\n%s\nwant exactly 2 (each once)", joined)
	}
}
