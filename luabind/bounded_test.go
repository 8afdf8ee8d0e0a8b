package luabind

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// lockedBuffer is a log sink shared by the calls' goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Issue 46, item 1: each entry point from a Lua value to Go goes through the one
// bounded path: what is over its budget is refused (or cut, for messages) before
// it is built, with the script's file:line. The adversarial cases (luabind/
// adversary) attack the same entry points with their largest inputs.
func TestEveryConversionIsBounded(t *testing.T) {
	logs := &lockedBuffer{}
	kube := &postedKube{}
	rt := loadedRuntime(t, Options{Shards: 1, Kube: kube, Logger: slog.New(slog.NewTextHandler(logs, nil))}, "b.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
local big = string.rep("z", 2 * 1024 * 1024)
local nul = string.rep("\0", 300000)
luaop.on.create(R, function(ctx) return {s = nul} end, {id = "result_escapes"})
luaop.on.create(R, function(ctx) ctx.patch.status.s = nul end, {id = "patch_escapes"})
luaop.on.create(R, function(ctx) ctx.patch.a.b.c = ctx.patch.a end, {id = "patch_cycle"})
luaop.on.create(R, function(ctx) ctx.logger.info("first"); ctx.logger.info(big); ctx.logger.info("after") end, {id = "logger"})
luaop.on.create(R, function(ctx) ctx.logger.info("fields", {a = big}); ctx.logger.info("after") end, {id = "fields"})
luaop.on.create(R, function(ctx) print("p1", 2); print(big); print("after") end, {id = "print"})
luaop.on.create(R, function(ctx) error(big) end, {id = "error_string"})
luaop.on.create(R, function(ctx) error({big, big}) end, {id = "error_table"})
luaop.on.create(R, function(ctx) return tostring(setmetatable({}, {__tostring = function() return {} end})) end, {id = "tostring"})
luaop.on.create(R, function(ctx) return string.format("%s|%5.1f|%q", "x", 2.25, "a\n") end, {id = "format"})
luaop.on.create(R, function(ctx) return luaop.json.encode(string.rep("<", 3e6)) end, {id = "json"})
luaop.on.create(R, function(ctx) return #luaop.json.encode(string.rep("<", 2e6)) end, {id = "json_fits"})
local m = luaop.metrics.counter("bounded", "help", {"k"})
luaop.on.create(R, function(ctx) m:inc({k = string.rep("v", 5000)}) end, {id = "label"})
luaop.on.create(R, function(ctx) m:inc({k = "short"}) return "ok" end, {id = "label_fits"})
luaop.on.create(R, function(ctx) luaop.event(ctx.body, "Normal", "Big", big) end, {id = "event"})
luaop.on.create(R, function(ctx) luaop.exception(ctx.body, "Big", "m", big) end, {id = "exception"})
`)
	call := func(id string) (causes.Result, error) {
		return rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, id), Cause: createCause("u-" + id), Patch: state.NewPatch()})
	}
	for _, tc := range []struct{ id, want string }{
		{"result_escapes", "b.lua:5: the handler's return value: s: value too large: more than 1572864 bytes as JSON"},
		{"patch_escapes", "b.lua:6: ctx.patch: ctx.patch.status.s: value too large: more than 1572864 bytes as JSON"},
		{"patch_cycle", "b.lua:7: ctx.patch: cycle at ctx.patch.a.b.c: it refers back to ctx.patch.a"},
		{"tostring", "b.lua:13: tostring: '__tostring' must return a string"},
		{"json", "b.lua:15: bad argument #1 to encode (value: value too large: more than 16777216 bytes as JSON"},
		{"label", "b.lua:18: luaop_script_bounded:inc: label values of more than 4096 bytes in all"},
	} {
		_, err := call(tc.id)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %.300v, want %q", tc.id, err, tc.want)
		}
	}
	for id, want := range map[string]any{"format": "x|  2.2|\"a\\\n\"", "json_fits": int64(12000002), "label_fits": "ok"} {
		if res, err := call(id); err != nil || res.Value != want {
			t.Errorf("%s = %#v, %v; want %#v", id, res.Value, err, want)
		}
	}
	// Messages are cut, not refused.
	_, err := call("error_string")
	if se, ok := err.(*ScriptError); !ok || se.Line != 11 || len(se.Message) > luaerr.MaxMessage+10 || !strings.HasSuffix(se.Message, "zz…") {
		t.Errorf("error(big): %T %.100v", err, err)
	}
	_, err = call("error_table")
	if se, ok := err.(*ScriptError); !ok || se.Line != 12 || len(se.Message) > 1010 || !strings.HasPrefix(se.Message, `{[1] = "zzz`) {
		t.Errorf("error({big, big}): %T %.100v", err, err)
	}
	for _, id := range []string{"event", "exception"} {
		if _, err := call(id); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range kube.events {
		if len(e) > luaerr.MaxMessage+100 {
			t.Errorf("an Event of %d bytes", len(e))
		}
	}
	// Log messages over the call's log budget are dropped (with one warning): the
	// budget counts the message, its fields and print alike.
	for _, id := range []string{"logger", "fields", "print"} {
		if _, err := call(id); err != nil {
			t.Fatal(err)
		}
	}
	out := logs.String()
	for _, want := range []string{`msg=first`, `msg="p1\t2"`, `log budget of this call reached (1.0 MiB)`} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q", want)
		}
	}
	if strings.Contains(out, "zzzz") || strings.Contains(out, "msg=after") || strings.Contains(out, "msg=fields") {
		t.Errorf("a message over the budget was written, or one after it (%d bytes of log)", len(out))
	}
}
