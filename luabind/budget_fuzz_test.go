package luabind

import (
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind/adversary"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Fuzzing of a handler call, and of luaop.json and luaop.yaml through one (`make
// fuzz`; as tests, the seeds run in `make test`): whatever a handler's body or the
// document it decodes, the call ends within a second of its deadline, with a result
// or an error, the runtime never panics, and it serves the next call.

const fuzzCallDeadline = 300 * time.Millisecond

// fuzzRuntime loads a script whose handler "body" runs BODY (loadstring'd from the
// object's spec.body, so that the fuzzer changes data, not the scripts) and "decode"
// decodes spec.doc as JSON and YAML and encodes the result again.
func fuzzRuntime(t testing.TB) *Runtime {
	return loadedRuntime(t, Options{Shards: 1, HandlerTimeout: fuzzCallDeadline}, "fuzz.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local f = loadstring(ctx.spec.body)
  if f then return f() end
end, {id = "body"})
luaop.on.create("example.com/v1/widgets", function(ctx)
  local j = luaop.json.decode(ctx.spec.doc)
  local y = luaop.yaml.decode(ctx.spec.doc)
  return {j = luaop.json.encode(j or {}), y = luaop.json.encode(y or {})}
end, {id = "decode"})
luaop.on.create("example.com/v1/widgets", function(ctx) return "fine" end, {id = "fine"})`)
}

func fuzzCall(t *testing.T, rt *Runtime, id string, spec map[string]any) error {
	t.Helper()
	body := widgetObject("fuzz")
	body["spec"] = spec
	start := time.Now()
	_, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, id), Cause: causes.Cause{Reason: causes.Create, Body: body}, Patch: state.NewPatch()})
	slack := time.Second
	if raceDetector { // converting a large result is many times slower with it
		slack = 8 * time.Second
	}
	if took := time.Since(start); took > fuzzCallDeadline+slack {
		t.Fatalf("the call ran %s, deadline %s", took, fuzzCallDeadline)
	}
	if res := mustInvoke(t, rt, "fine", createCause("fuzz")); res.Value != "fine" {
		t.Fatalf("the next call: %#v", res.Value)
	}
	return err
}

// FuzzCall runs any handler body (the adversarial ones among the seeds).
func FuzzCall(f *testing.F) {
	for _, c := range adversary.Cases {
		if !strings.Contains(c.Body, "ctx.") && !strings.Contains(c.Body, "luaop.") {
			f.Add(c.Body)
		}
	}
	for _, s := range []string{"return 1", "return {a = {1, 2}}", "error('x')", "return setmetatable({}, {__index = function() error('y') end}).x",
		"local t = {} t[1] = t return t", "return 0/0", "return string.rep('ab', 1e5)"} {
		f.Add(s)
	}
	rt := fuzzRuntime(f)
	f.Fuzz(func(t *testing.T, body string) {
		fuzzCall(t, rt, "body", map[string]any{"body": body})
	})
}

// FuzzDecode decodes any document with luaop.json.decode and luaop.yaml.decode and
// encodes what they gave with luaop.json.encode.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{}`, `[1, 2, {"a": null}]`, `a: 1`, "a: &a [1, 2]\nb: [*a, *a]", "a: &a x\nb: *a\nc: [*b]",
		"- &x {a: 1}\n- *x\n- [*x, *x]", `"\u0000"`, "[" + strings.Repeat("[", 200) + strings.Repeat("]", 200) + "]", "!!binary aGk=", "a: !!float 1e400"} {
		f.Add(s)
	}
	rt := fuzzRuntime(f)
	f.Fuzz(func(t *testing.T, doc string) {
		fuzzCall(t, rt, "decode", map[string]any{"doc": doc})
	})
}
