package luabind

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// postedKube records the Events scripts post.
type postedKube struct {
	Kube
	mu     sync.Mutex
	events []string // "name type reason message"
}

func (k *postedKube) Event(_ context.Context, obj map[string]any, eventType, reason, message string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, _, _, name := state.Identity(obj)
	k.events = append(k.events, strings.Join([]string{name, eventType, reason, message}, "|"))
	return nil
}

// kopf's posting functions: event with any type, info/warn/exception, each for one
// object or a list of them; exception takes the error itself (kopf: reason from the
// error's type, message "<message> <error>").
func TestEventFunctionsAsKopfs(t *testing.T) {
	kube := &postedKube{}
	rt := loadedRuntime(t, Options{Kube: kube}, "ev.lua", `
local luaop = require("luaop")
luaop.on.create("`+widgetsResource+`", function(ctx)
  local child = { apiVersion = "v1", kind = "Pod", metadata = { name = "child", namespace = "ns1" } }
  assert(luaop.event(ctx.body, "SomeType", "SomeReason", "Some message"))
  assert(luaop.event({ ctx.body, child }, "Normal", "ForBoth", "two objects"))
  assert(luaop.info(ctx.body, "AnyReason"))
  assert(luaop.warn({ child }, "Careful", "a list of one"))
  local ok, err = pcall(function() error("Exception text.", 0) end)
  assert(luaop.exception(ctx.body, "SomeReason", "Some exception:", err))
  assert(luaop.exception(ctx.body, luaop.temporary_error("not ready yet", 5)))
  assert(luaop.exception(ctx.body, nil, nil, "plain"))
  assert(luaop.exception(ctx.body, "OnlyAReason", "and a message"))
end, { id = "poster" })
`)
	if _, err := rt.Invoke(t.Context(), causes.Call{Handler: specOf(t, rt, "poster"), Cause: createCause("u1"), Patch: state.NewPatch()}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"w1|SomeType|SomeReason|Some message",
		"w1|Normal|ForBoth|two objects", "child|Normal|ForBoth|two objects",
		"w1|Normal|AnyReason|",
		"child|Warning|Careful|a list of one",
		"w1|Warning|SomeReason|Some exception: Exception text.",
		"w1|Warning|TemporaryError|not ready yet",
		"w1|Warning|Error|plain",
		"w1|Warning|OnlyAReason|and a message",
	}
	if strings.Join(kube.events, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(kube.events, "\n"), strings.Join(want, "\n"))
	}
}
