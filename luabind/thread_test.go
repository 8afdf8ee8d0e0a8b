package luabind

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/luaop/luaop/processing/causes"
)

// Call threads start with small stacks (thread.go) that grow: deep recursion and
// large table.concat / unpack work within the limits, and going past a limit is a
// Lua error of that call, never a crash; the thread is reused afterwards.
func TestThreadStacksGrowWithinLimits(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 1}, "t.lua", `
		local luaop = require("luaop")
		local R = "example.com/v1/things"
		local function depth(n) if n == 0 then return 0 end return 1 + depth(n - 1) end
		luaop.on.create(R, function(ctx) return { depth = depth(150) } end, { id = "recurse" })
		luaop.on.create(R, function(ctx) return { depth = depth(100000) } end, { id = "too_deep" })
		luaop.on.create(R, function(ctx)
			local t = {}
			for i = 1, 5000 do t[i] = "x" .. i end
			local s = table.concat(t, ",")
			local w = {}
			for i = 1, 100000 do w[i] = i end
			return { len = #s, sum = select("#", unpack(t)), wide = select("#", unpack(w)) }
		end, { id = "concat" })
		luaop.on.create(R, function(ctx)
			local t = {}
			for i = 1, 200000 do t[i] = true end
			return { n = select("#", unpack(t)) }
		end, { id = "too_wide" })
	`)
	body := map[string]any{"metadata": map[string]any{"uid": "u1", "name": "a", "namespace": "ns"}}
	invoke := func(id string) (causes.Result, error) {
		return rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, id), Cause: causes.Cause{Reason: causes.Create, Body: body}})
	}
	for round := 0; round < 2; round++ { // the second round runs on threads that failed before
		res, err := invoke("recurse")
		if err != nil || !reflect.DeepEqual(res.Value, map[string]any{"depth": int64(150)}) {
			t.Fatalf("recursion 150 deep: %v, %v", res.Value, err)
		}
		res, err = invoke("concat")
		want := map[string]any{"len": int64(len(concatWant(5000))), "sum": int64(5000), "wide": int64(100000)}
		if err != nil || !reflect.DeepEqual(res.Value, want) {
			t.Fatalf("table.concat of 5,000 items, unpack of 5,000 and 100,000: %v, %v; want %v", res.Value, err, want)
		}
		if _, err := invoke("too_deep"); err == nil || !strings.Contains(err.Error(), "stack overflow") {
			t.Fatalf("recursion 100,000 deep: %v, want a stack overflow error", err)
		}
		if _, err := invoke("too_wide"); err == nil || !strings.Contains(err.Error(), "registry overflow") {
			t.Fatalf("unpack of 200,000 values: %v, want a registry overflow error", err)
		}
	}
}

func concatWant(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		if i > 1 {
			b.WriteByte(',')
		}
		b.WriteString("x")
		b.WriteString(strconv.Itoa(i))
	}
	return b.String()
}
