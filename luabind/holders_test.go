package luabind

import (
	"errors"
	"strings"
	"testing"

	"github.com/luaop/luaop/processing/causes"
)

// Issue 46, item 4: a file that keeps data in a file-level table across calls, and
// an object's memo, hold memory the budget counts; when it cancels an innocent call
// of another file, the error and the report (/debug) name the file holding the
// most, measured, then the memo.
func TestMemoryBudgetNamesWhoseMemory(t *testing.T) {
	rt, _ := budgetedRuntime(t, 96<<20, "hoarder.lua", `local luaop = require("luaop")
local cache = {}
luaop.on.create("example.com/v1/widgets", function(ctx)
  for i = 1, 60 do cache[#cache + 1] = string.rep("h", 1e6) .. #cache end
end, {id = "hoard"})
luaop.on.create("example.com/v1/widgets", function(ctx)
  ctx.memo.big = {}
  for i = 1, 8 do ctx.memo.big[i] = string.rep("m", 1e6) .. i end
end, {id = "memo"})`, "innocent.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  local t = {}
  for i = 1, 1e9 do t[i] = string.rep("x", 1e6) .. i end
end, {id = "innocent"})
luaop.on.create("example.com/v1/widgets", function(ctx) return "fine" end, {id = "fine"})`)
	mustInvoke(t, rt, "hoard", createCause("hoarding"))
	memo := causes.Cause{Reason: causes.Create, Body: widgetBody("memo-uid", "kept")}
	if _, _, err := invokeHandler(t, rt, "memo", memo); err != nil {
		t.Fatal(err)
	}
	_, _, err := invokeHandler(t, rt, "innocent", createCause("innocent"))
	if !errors.Is(err, ErrMemoryBudget) {
		t.Fatalf("err = %v, want the memory budget's", err)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "innocent.lua:4: memory budget exceeded") ||
		!strings.Contains(msg, "data kept across calls, measured: most by file hoarder.lua 5") ||
		!strings.Contains(msg, "then memo of ns/kept 7.") {
		t.Errorf("error = %s", msg)
	}
	t.Logf("the error: %v", err)
	rep := rt.MemoryReport()
	if rep == nil || rep.Call != "innocent" || len(rep.Holders) < 2 {
		t.Fatalf("report = %+v", rep)
	}
	if h := rep.Holders[0]; h.What != "file hoarder.lua" || h.Bytes < 60e6 || h.Bytes > 70e6 {
		t.Errorf("largest holder = %v, want hoarder.lua with about 60 MB", h)
	}
	if h := rep.Holders[1]; h.What != "memo of ns/kept" || h.Bytes < 8e6 || h.Bytes > 9e6 {
		t.Errorf("second holder = %v, want the memo of ns/kept with about 8 MB", h)
	}
	if res := mustInvoke(t, rt, "fine", createCause("innocent")); res.Value != "fine" {
		t.Errorf("after: %#v", res.Value)
	}
}
