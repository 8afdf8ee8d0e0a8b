package luabind

import (
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// Issue 12, item 3: what a handler wrote to ctx.patch before raising is applied,
// whatever the error kind (kopf shares the patch across the cycle).
func TestPatchWrittenBeforeAnErrorIsKept(t *testing.T) {
	rt := loadedRuntime(t, Options{HandlerTimeout: 300 * time.Millisecond}, "p.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
local function waiting(ctx) ctx.patch.status.phase = "Waiting" end
luaop.on.create(R, function(ctx) waiting(ctx); error(luaop.temporary_error("not yet", 5)) end, {id = "temporary"})
luaop.on.create(R, function(ctx) waiting(ctx); error(luaop.permanent_error("never")) end, {id = "permanent"})
luaop.on.create(R, function(ctx) waiting(ctx); error("boom") end, {id = "arbitrary"})
luaop.on.create(R, function(ctx) waiting(ctx); while true do end end, {id = "timeout"})
luaop.on.create(R, function(ctx) waiting(ctx); local x = nil; return x.y end, {id = "runtime"})
`)
	for _, tc := range []struct {
		id   string
		kind func(error) bool
	}{
		{"temporary", func(err error) bool { _, ok := causes.AsTemporary(err); return ok }},
		{"permanent", causes.IsPermanent},
		{"arbitrary", func(err error) bool { return strings.Contains(err.Error(), "boom") }},
		{"timeout", func(err error) bool { return strings.Contains(err.Error(), "deadline") }},
		{"runtime", func(err error) bool { return err != nil }},
	} {
		t.Run(tc.id, func(t *testing.T) {
			_, patch, err := invokeHandler(t, rt, tc.id, createCause("u-"+tc.id))
			if err == nil || !tc.kind(err) {
				t.Fatalf("err = %v; want a %s error", err, tc.id)
			}
			got, _ := state.Resolve(patch.Map(), []string{"status", "phase"})
			if got != "Waiting" {
				t.Errorf("patch = %#v; want status.phase = Waiting kept after the error", patch.Map())
			}
		})
	}
}

// Issue 12, item 8: value matches the old or the new value; value, old and new take
// luaop.PRESENT, luaop.ABSENT and functions; field alone is a presence filter for
// daemons, timers, event handlers and indexes.
func TestValueFilters(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "v.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
local function h() end
luaop.on.field(R, "spec.mode", h, {id = "field_value", value = "on"})
luaop.on.update(R, h, {id = "update_field_value", field = "spec.mode", value = "on"})
luaop.on.field(R, "spec.mode", h, {id = "field_present", value = luaop.PRESENT})
luaop.on.field(R, "spec.mode", h, {id = "field_absent", value = luaop.ABSENT})
luaop.on.field(R, "spec.mode", h, {id = "field_fn", value = function(v, ctx) return v == "on" and ctx.name == "w1" end})
luaop.on.field(R, "spec.mode", h, {id = "old_present", old = luaop.PRESENT})
luaop.on.field(R, "spec.mode", h, {id = "old_absent", old = luaop.ABSENT})
luaop.on.field(R, "spec.mode", h, {id = "new_absent", new = luaop.ABSENT})
luaop.on.field(R, "spec.mode", h, {id = "old_fn_new_fn", old = function(v) return v == "off" end, new = function(v) return v == "on" end})
luaop.on.field(R, "spec.mode", h, {id = "old_new_eq", old = "off", new = "on"})
luaop.on.update(R, h, {id = "update_old_absent", old = luaop.ABSENT})
luaop.daemon(R, h, {id = "daemon_field", field = "spec.mode"})
luaop.timer(R, h, {id = "timer_field", field = "spec.mode", interval = 1})
luaop.on.event(R, h, {id = "event_field", field = "spec.mode"})
luaop.index(R, h, {id = "index_field", field = "spec.mode"})
luaop.daemon(R, h, {id = "daemon_value", field = "spec.mode", value = "on"})
luaop.daemon(R, h, {id = "daemon_present", field = "spec.mode", value = luaop.PRESENT})
luaop.daemon(R, h, {id = "daemon_absent", field = "spec.mode", value = luaop.ABSENT})
luaop.timer(R, h, {id = "timer_fn", field = "spec.mode", value = function(v, ctx) return v == "on" end, interval = 1})
luaop.on.event(R, h, {id = "event_fn_absent", field = "spec.mode", value = function(v) return v == nil end})
`)
	// old/new are what processing gives a field handler: the field's values.
	change := func(old, new any, mode any) causes.Cause {
		c := createCause("v1")
		c.Reason = causes.Update
		c.Old, c.New = old, new
		if mode == nil {
			delete(c.Body["spec"].(map[string]any), "mode")
		} else {
			c.Body["spec"].(map[string]any)["mode"] = mode
		}
		return c
	}
	body := func(mode any) causes.Cause {
		c := createCause("v1")
		c.Reason = ""
		if mode == nil {
			delete(c.Body["spec"].(map[string]any), "mode")
		} else {
			c.Body["spec"].(map[string]any)["mode"] = mode
		}
		return c
	}
	cases := []struct {
		name  string
		id    string
		cause causes.Cause
		want  bool
	}{
		{"value matches the new value", "field_value", change("off", "on", "on"), true},
		{"value matches the old value", "field_value", change("on", "off", "off"), true},
		{"value matches neither", "field_value", change("off", "auto", "auto"), false},
		{"value on update(field=) matches the old value", "update_field_value", change("on", nil, nil), true},
		{"value on creation (no old)", "field_value", change(nil, "on", "on"), true},
		{"PRESENT: new only", "field_present", change(nil, "on", "on"), true},
		{"PRESENT: old only", "field_present", change("on", nil, nil), true},
		{"ABSENT: old absent", "field_absent", change(nil, "on", "on"), true},
		{"ABSENT: both present", "field_absent", change("off", "on", "on"), false},
		{"function: new", "field_fn", change("off", "on", "on"), true},
		{"function: old", "field_fn", change("on", "off", "off"), true},
		{"function: neither", "field_fn", change("off", "auto", "auto"), false},
		{"old PRESENT", "old_present", change("off", "on", "on"), true},
		{"old PRESENT on creation", "old_present", change(nil, "on", "on"), false},
		{"old ABSENT on creation", "old_absent", change(nil, "on", "on"), true},
		{"old ABSENT on update", "old_absent", change("off", "on", "on"), false},
		{"new ABSENT on removal", "new_absent", change("off", nil, nil), true},
		{"new ABSENT on change", "new_absent", change("off", "on", "on"), false},
		{"old and new functions", "old_fn_new_fn", change("off", "on", "on"), true},
		{"old and new functions, wrong old", "old_fn_new_fn", change("auto", "on", "on"), false},
		{"old and new values", "old_new_eq", change("off", "on", "on"), true},
		{"old and new values, wrong new", "old_new_eq", change("off", "auto", "auto"), false},
		{"update old ABSENT (whole object)", "update_old_absent", change(nil, map[string]any{}, "on"), true},
		{"daemon field present", "daemon_field", body("on"), true},
		{"daemon field absent", "daemon_field", body(nil), false},
		{"timer field present", "timer_field", body("x"), true},
		{"timer field absent", "timer_field", body(nil), false},
		{"event field present", "event_field", body("x"), true},
		{"event field absent", "event_field", body(nil), false},
		{"index field present", "index_field", body("x"), true},
		{"index field absent", "index_field", body(nil), false},
		{"daemon value", "daemon_value", body("on"), true},
		{"daemon other value", "daemon_value", body("off"), false},
		{"daemon PRESENT", "daemon_present", body("off"), true},
		{"daemon PRESENT, absent", "daemon_present", body(nil), false},
		{"daemon ABSENT", "daemon_absent", body(nil), true},
		{"daemon ABSENT, present", "daemon_absent", body("on"), false},
		{"timer function", "timer_fn", body("on"), true},
		{"timer function, other", "timer_fn", body("off"), false},
		{"event function sees nil for absent", "event_fn_absent", body(nil), true},
		{"event function, present", "event_fn_absent", body("on"), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := rt.Match(t.Context(), specOf(t, rt, tc.id), tc.cause)
			if err != nil || ok != tc.want {
				t.Errorf("Match(%s) = %v, %v; want %v", tc.id, ok, err, tc.want)
			}
		})
	}
}

func TestValueFilterOptionErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"old on a daemon", `luaop.daemon(R, h, {field = "spec.x", old = 1})`, "option old applies to change handlers only"},
		{"new on a timer", `luaop.timer(R, h, {interval = 1, new = luaop.PRESENT})`, "option new applies to change handlers only"},
		{"value without field", `luaop.daemon(R, h, {value = luaop.PRESENT})`, "option value needs a field"},
		{"unconvertible value", `luaop.on.update(R, h, {field = "spec.x", value = {h}})`, "option value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := newTestRuntime(t, Options{})
			_, err := rt.Load(t.Context(), scriptsOf("e.lua", "local luaop = require('luaop')\nlocal R = 'example.com/v1/widgets'\nlocal function h() end\n"+tc.src+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load error = %v; want %q", err, tc.want)
			}
		})
	}
}

// Issue 12, item 9: a subhandler whose filters do not match is not returned to
// processing: it does not run and its parent does not wait for it.
func TestSubhandlerFilters(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "s.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
local function h() end
luaop.on.update(R, function(ctx)
  ctx.subhandler(h, {id = "plain"})
  ctx.subhandler(h, {id = "label_ok", labels = {app = "x"}})
  ctx.subhandler(h, {id = "label_no", labels = {app = "y"}})
  ctx.subhandler(h, {id = "label_fn_no", labels = {app = function(v) return v == "y" end}})
  ctx.subhandler(h, {id = "annot_absent_no", annotations = {["example.com/note"] = luaop.ABSENT}})
  ctx.subhandler(h, {id = "when_ok", when = function(c) return c.spec.size == 3 end})
  ctx.subhandler(h, {id = "when_no", when = function(c) return c.spec.size == 4 end})
  ctx.subhandler(h, {id = "field_ok", field = "spec.mode", value = "on"})
  ctx.subhandler(h, {id = "field_old_ok", field = "spec.mode", value = "was"})
  ctx.subhandler(h, {id = "field_no", field = "spec.mode", value = "off"})
  ctx.subhandler(h, {id = "field_absent_no", field = "spec.nothing"})
  ctx.subhandler(h, {id = "field_fn_ok", field = "spec.mode", value = function(v) return v == "on" end})
end, {id = "parent"})
luaop.on.update(R, function(ctx)
  ctx.subhandler(h, {id = "none", labels = {app = luaop.ABSENT}})
end, {id = "parent_all_filtered"})
`)
	cause := createCause("s1")
	cause.Reason = causes.Update
	cause.Old = map[string]any{"spec": map[string]any{"mode": "was", "size": int64(3)}}
	cause.New = map[string]any{"spec": map[string]any{"mode": "on", "size": int64(3)}}
	res := mustInvoke(t, rt, "parent", cause)
	var got []string
	for _, s := range res.Subhandlers {
		got = append(got, strings.TrimPrefix(s.ID, "parent/"))
	}
	want := []string{"plain", "label_ok", "when_ok", "field_ok", "field_old_ok", "field_fn_ok"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("subhandlers = %v; want %v", got, want)
	}
	res = mustInvoke(t, rt, "parent_all_filtered", cause)
	if len(res.Subhandlers) != 0 {
		t.Errorf("subhandlers = %v; want none (the parent is done)", res.Subhandlers)
	}
}

// Issue 12, item 10: the memo filled by startup handlers is copied into the memo
// of every object when it is first created.
func TestStartupMemoSeedsObjectMemos(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 3}, "m.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.startup(function(ctx)
  ctx.memo.config = {greeting = "hello", sizes = {1, 2}}
  ctx.memo.count = 7
  ctx.memo.fn = function() end
end, {id = "start"})
luaop.on.create(R, function(ctx)
  ctx.memo.count = ctx.memo.count + 1
  return {greeting = ctx.memo.config.greeting, size2 = ctx.memo.config.sizes[2], count = ctx.memo.count, fn = type(ctx.memo.fn)}
end, {id = "read"})
`)
	if _, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "start")}); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"a", "b", "c", "d", "e"} {
		res := mustInvoke(t, rt, "read", createCause(uid))
		m, _ := res.Value.(map[string]any)
		if m["greeting"] != "hello" || !state.ValuesEqual(m["size2"], int64(2)) || !state.ValuesEqual(m["count"], int64(8)) || m["fn"] != "nil" {
			t.Errorf("object %s sees %#v; want the startup memo (config, count 7 + 1; no function)", uid, m)
		}
	}
	// An object's memo, once created, is its own: a second call sees its own count.
	res := mustInvoke(t, rt, "read", createCause("a"))
	if m, _ := res.Value.(map[string]any); !state.ValuesEqual(m["count"], int64(9)) {
		t.Errorf("second call: %#v; want count 9", m)
	}
}
