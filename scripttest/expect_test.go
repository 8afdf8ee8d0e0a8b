package scripttest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// expectScripts are the handlers the expectation tests run.
const expectScripts = `local luaop = require("luaop")
local R = "example.com/v1/things"
luaop.on.create(R, function(ctx)
  if ctx.spec.status then ctx.patch.status.note = "x" end
  if ctx.spec.label then ctx.patch.metadata.labels = {a = "b"} end
  if ctx.spec.event then luaop.info(ctx.body, "Made", "made it") end
  if ctx.spec.kube then luaop.kube.create({apiVersion = "v1", kind = "ConfigMap", metadata = {name = "made", namespace = "ns"}}) end
  if ctx.spec.ret then return {ok = true} end
end, {id = "plain"})
luaop.on.create(R, function(ctx)
  ctx.subhandler(function(sub) return {k = 1} end, {id = "good"})
  ctx.subhandler(function(sub)
    if sub.spec.childfails then error(luaop.permanent_error("child broke")) end
    sub.patch.status.second = true
    return {k = 2}
  end, {id = "bad"})
  return "parent"
end, {id = "parent"})
luaop.on.event(R, function(ctx) return {seen = ctx.name} end, {id = "watch"})
luaop.on.field(R, "spec.size", function(ctx)
  ctx.subhandler(function(sub) return {mode = "on"} end, {id = "when_on", field = "spec.mode", value = "on"})
end, {id = "sized"})
-- The same resource by its kind: the field it names is in the essence every update
-- handler of the resource sees, as in the operator (which merges the spellings).
luaop.on.field("example.com/v1/Thing", "status.phase", function(ctx) return ctx.new end, {id = "phased"})
luaop.on.update(R, function(ctx)
  return {old = ctx.old.status and ctx.old.status.phase, new = ctx.new.status and ctx.new.status.phase}
end, {id = "phase_seen"})
luaop.on.create(R, function(ctx)
  local a = ctx.new.metadata.annotations or {}
  return {hidden = a["example.org/last"] == nil, kept = a["luaop.dev/last"] ~= nil}
end, {id = "annotations"})
luaop.on.create(R, function(ctx) if ctx.spec.once then error("nope") end end, {id = "once", retries = 1})
luaop.on.resume(R, function(ctx) return {old = ctx.old and ctx.old.spec.size, new = ctx.new.spec.size} end, {id = "resumed"})
luaop.on.startup(function(ctx)
  luaop.kube.create({apiVersion = "v1", kind = "ConfigMap", metadata = {name = "booted", namespace = "ns"}})
end, {id = "boot"})
luaop.daemon(R, function(ctx) ctx.patch.status.watched = true; return {done = ctx.name} end, {id = "watcher"})
`

// runOne runs one case (YAML, the list item without "- ") against expectScripts and
// returns whether it passed and the output.
func runOne(t *testing.T, prefix, c string) (bool, string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "h.lua"), []byte(expectScripts), 0o644); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(c), "\n")
	for i := range lines {
		if i == 0 {
			lines[i] = "- " + lines[i]
		} else {
			lines[i] = "  " + lines[i]
		}
	}
	path := filepath.Join(dir, "cases.yaml")
	if err := os.WriteFile(path, []byte("cases:\n"+strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: []string{path}, Out: &out, Prefix: prefix})
	if err != nil {
		return false, err.Error()
	}
	return sum.Failed == 0 && sum.Passed == 1, out.String()
}

const thing = `object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: %s}`

func obj(spec string) string { return strings.Replace(thing, "%s", spec, 1) }

func TestExpectations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		prefix string
		c      string
		pass   bool
		out    string // a substring of the output when the case fails
	}{
		// 1. An explicit {} or [] asserts emptiness; non-empty maps stay subsets.
		{name: "patch {} and nothing written", c: "handler: plain\n" + obj("{}") + "\nexpect: {patch: {}}", pass: true},
		{name: "patch {} but a label written", c: "handler: plain\n" + obj("{label: true}") + "\nexpect: {patch: {}}", out: "patch: (-want +got)"},
		{name: "patch {} but a result", c: "handler: plain\n" + obj("{ret: true}") + "\nexpect: {patch: {}}", out: "+ status:"},
		{name: "patch subset still", c: "handler: plain\n" + obj("{label: true, status: true}") + "\nexpect: {patch: {metadata: {labels: {a: b}}}}", pass: true},
		{name: "status {} and none written", c: "handler: plain\n" + obj("{label: true}") + "\nexpect: {status: {}}", pass: true},
		{name: "status {} but written", c: "handler: plain\n" + obj("{status: true}") + "\nexpect: {status: {}}", out: "+ note: x"},
		{name: "status null but written", c: "handler: plain\n" + obj("{status: true}") + "\nexpect: {status: null}", out: "+ note: x"},
		{name: "nested {} asserts an empty map", c: "handler: plain\n" + obj("{ret: true}") + "\nexpect: {status: {plain: {}}}", out: "+   ok: true"},
		{name: "events [] and none", c: "handler: plain\n" + obj("{}") + "\nexpect: {events: []}", pass: true},
		{name: "events [] but one", c: "handler: plain\n" + obj("{event: true}") + "\nexpect: {events: []}", out: "events: (-want +got)"},
		{name: "events null but one", c: "handler: plain\n" + obj("{event: true}") + "\nexpect: {events: null}", out: "events: (-want +got)"},
		{name: "kube [] but a call", c: "handler: plain\n" + obj("{kube: true}") + "\nexpect: {kube: []}", out: "luaop.kube calls: (-want +got)"},
		{name: "objects [] and none", c: "handler: plain\n" + obj("{}") + "\nexpect: {objects: []}", pass: true},
		{name: "objects [] but one made", c: "handler: plain\n" + obj("{kube: true}") + "\nexpect: {objects: []}", out: "want the fake API to hold no objects (objects: []), it holds v1 ConfigMap ns/made"},
		{name: "objects {} but one made", c: "handler: plain\n" + obj("{kube: true}") + "\nexpect: {objects: {}}", out: "want the fake API to hold no objects"},
		{name: "unknown expectation still rejected", c: "handler: plain\n" + obj("{}") + "\nexpect: {patches: {}}", out: `cases.yaml:4: unknown key "patches" in expect:; the keys of expect: are allowed, code,`},

		// 2. Subhandlers run, their results and errors count.
		{name: "child error fails the case", c: "handler: parent\n" + obj("{childfails: true}") + "\nexpect: {}", out: "unexpected error: subhandler parent/bad failed: permanent error \"child broke\""},
		{name: "child error expected", c: "handler: parent\n" + obj("{childfails: true}") + "\nexpect: {error: {type: permanent, message: child broke}, status: {parent: parent, parent/good: {k: 1}}}", pass: true},
		{name: "child results in status", c: "handler: parent\n" + obj("{}") + "\nexpect: {status: {parent: parent, parent/good: {k: 1}, parent/bad: {k: 2}, second: true}, result: parent}", pass: true},
		{name: "child error by cause", c: "cause: create\n" + obj("{childfails: true}") + "\nexpect: {}", out: "subhandler parent/bad failed"},

		// A field handler's subhandler filtering on another field sees it, as in
		// the operator (the whole old and new objects go along with the reduced cause).
		{name: "field subhandler on another field", c: "handler: sized\n" + obj("{size: 2, mode: on}") + "\nold: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 1, mode: on}}\nexpect: {status: {sized/when_on: {mode: on}}}", pass: true},
		{name: "field subhandler filtered out", c: "handler: sized\n" + obj("{size: 2, mode: off}") + "\nold: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 1, mode: off}}\nexpect: {status: {sized/when_on: {mode: on}}}", out: "status"},

		// A field named by a handler of the resource spelled another way (its kind) is
		// part of the essence an update handler sees: luaop test compared the
		// spellings literally, and this update handler saw no change at all.
		{name: "field named under the kind's spelling", c: "handler: phase_seen\n" + strings.Replace(obj("{size: 1}"), "spec: {size: 1}}", "spec: {size: 1}, status: {phase: B}}", 1) + "\nold: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 1}, status: {phase: A}}\nexpect: {result: {old: A, new: B}}", pass: true},

		// A resume is a cause without a change: without old:, the handler's ctx.old
		// is the object's essence, as the core's resume cause carries the stored one.
		{name: "resume without old", c: "handler: resumed\n" + obj("{size: 4}") + "\nexpect: {result: {old: 4, new: 4}}", pass: true},
		// An update that changes nothing runs no handler in the core, for that
		// reason, not for its filters.
		{name: "update without a change", c: "handler: phase_seen\n" + obj("{size: 1}") + "\nold: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 1}}\nexpect: {}",
			out: "the handler takes no part in the cause: the update changes nothing"},
		{name: "update without a change by cause", c: "cause: update\n" + obj("{size: 1}") + "\nold: {apiVersion: example.com/v1, kind: Thing, metadata: {name: a, namespace: ns}, spec: {size: 1}}\nexpect: {}",
			out: "no handler takes part in the cause: "},
		// A hook is tied to no object: its case needs none.
		{name: "hook without an object", c: "handler: boot\nexpect: {kube: [{verb: create, kind: ConfigMap, name: booted}]}", pass: true},
		// A daemon's result goes to status.<id>, as kopf delivers it (daemons.py).
		{name: "daemon result in status", c: "handler: watcher\n" + obj("{}") + "\nexpect: {status: {watched: true, watcher: {done: a}}}", pass: true},

		// An error at the last allowed attempt: the operator would not retry it.
		{name: "error at the last retry", c: "handler: once\n" + obj("{once: true}") + "\nexpect: {}",
			out: "the operator fails the handler for good: handler once exceeded its 1 retries (last error: h.lua:"},

		// 3. result: null asserts that nothing was returned.
		{name: "result null and none", c: "handler: plain\n" + obj("{}") + "\nexpect: {result: null}", pass: true},
		{name: "result by cause", c: "cause: create\n" + obj("{}") + "\nexpect: {result: null}", out: "result: is compared only in handler: cases"},
		{name: "result null but returned", c: "handler: plain\n" + obj("{ret: true}") + "\nexpect: {result: null}", out: "result: (-want +got)"},

		// 4. Event handlers' results go to status.<id>.
		{name: "event result in status", c: "handler: watch\n" + obj("{}") + "\nexpect: {status: {watch: {seen: a}}}", pass: true},

		// 5. The prefix comes from the options.
		{name: "default prefix", c: "handler: annotations\n" + strings.Replace(obj("{}"), "namespace: ns}", "namespace: ns, annotations: {luaop.dev/last: x, example.org/last: y}}", 1) + "\nexpect: {result: {hidden: false, kept: false}}", pass: true},
		{name: "other prefix", prefix: "example.org", c: "handler: annotations\n" + strings.Replace(obj("{}"), "namespace: ns}", "namespace: ns, annotations: {luaop.dev/last: x, example.org/last: y}}", 1) + "\nexpect: {result: {hidden: true, kept: true}}", pass: true},

		// 6. The object must be of the handler's resource.
		{name: "wrong kind", c: "handler: plain\nobject: {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\nexpect: {}", out: `handler plain watches example.com/v1/things, but the object is apiVersion "v1", kind "ConfigMap"`},
		{name: "wrong version", c: "handler: plain\nobject: {apiVersion: example.com/v2, kind: Thing, metadata: {name: a}}\nexpect: {}", out: "handler plain watches example.com/v1/things"},
		{name: "wrong explicit resource", c: "handler: plain\nresource: example.com/v1/others\n" + obj("{}") + "\nexpect: {}", out: "but the case gives resource: example.com/v1/others"},
		{name: "explicit resource", c: "handler: plain\nresource: example.com/v1/things\nobject: {apiVersion: example.com/v1, kind: Thingy, metadata: {name: a}}\nexpect: {}", pass: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pass, out := runOne(t, tc.prefix, tc.c)
			if pass != tc.pass {
				t.Fatalf("passed: %v, want %v\n%s", pass, tc.pass, out)
			}
			if !tc.pass && !strings.Contains(out, tc.out) {
				t.Errorf("output lacks %q:\n%s", tc.out, out)
			}
		})
	}
}

// A test file is YAML 1.2, and a misspelled key is reported at its line with the
// keys allowed there (not as a JSON error of the whole file).
func TestFixturesAreYAML12WithLines(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "h.lua"), []byte(`local luaop = require("luaop")
luaop.on.create("example.com/v1/things", function(ctx)
  local n = 0
  for k, v in pairs(ctx.body.data) do n = n + 1 end
  return {keys = n, country = ctx.body.data.country, n = ctx.body.data.n}
end, {id = "count"})
`), 0o644); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// YAML 1.1 made n: a "false" key and NO false.
	good := write("cases.yaml", "cases:\n- name: yaml 1.2\n  handler: count\n  object: {apiVersion: example.com/v1, kind: Thing, metadata: {name: c}, data: {n: \"2\", country: NO}}\n  expect:\n    result: {keys: 2, country: \"NO\", n: \"2\"}\n")
	var out strings.Builder
	sum, err := Run(t.Context(), Options{Scripts: dir, Tests: []string{good}, Out: &out})
	if err != nil || sum.Passed != 1 {
		t.Fatalf("YAML 1.2 case: %+v %v\n%s", sum, err, out.String())
	}
	if sum.Cases[0].Line != 2 || sum.Cases[0].Name != "yaml 1.2" {
		t.Errorf("case result %+v: want line 2", sum.Cases[0])
	}
	bad := write("bad.yaml", "cases:\n- name: typo\n  handler: count\n  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n  expcet:\n    result: {}\n- name: wrong type\n  handler: count\n  object: {apiVersion: v1, kind: ConfigMap}\n  expect:\n    allowed: \"yes\"\n")
	_, err = Run(t.Context(), Options{Scripts: dir, Tests: []string{bad}, Out: &out})
	for _, want := range []string{
		bad + `:5: unknown key "expcet" in a case; the keys of a case are cause, crds, dryRun, eventType, expect, fail, handler,`,
		bad + `:11: case 2: expect.allowed: a string where bool is expected`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v\nwant it to contain %q", err, want)
		}
	}
	// --run matching nothing is an error, not a pass.
	_, err = Run(t.Context(), Options{Scripts: dir, Tests: []string{good}, Out: &out, Run: regexp.MustCompile("nomatch")})
	if !errors.Is(err, ErrNoCaseMatches) || !strings.Contains(err.Error(), "cases.yaml/yaml 1.2") {
		t.Errorf("--run nomatch: %v, want ErrNoCaseMatches listing the cases", err)
	}
}
