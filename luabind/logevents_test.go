package luabind

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// eventsKube records the Events posted through it.
type eventsKube struct {
	Kube
	mu     sync.Mutex
	events []string // "type reason message kind/name"
}

func (k *eventsKube) Event(ctx context.Context, obj map[string]any, eventType, reason, message string) error {
	meta, _ := obj["metadata"].(map[string]any)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.events = append(k.events, fmt.Sprintf("%s %s %s %v/%v", eventType, reason, message, obj["kind"], meta["name"]))
	return nil
}

func (k *eventsKube) posted() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.events...)
}

const logEventsScript = `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx)
  ctx.logger.debug("details")
  ctx.logger.info("created", 1)
  ctx.logger:warn("careful")
  ctx.logger.error("broken")
end, {id = "logs"})
`

// Issue 12.16: ctx.logger messages are posted as Events of the object (kopf's object
// logger) at the level asked for; issue 45: none by default (kopf's
// posting.loggers=False since 1.41).
func TestLoggerMessagesArePostedAsEventsOfTheObject(t *testing.T) {
	tests := []struct {
		level string
		want  string
	}{
		{"", "[]"},
		{"info", "[Normal Logging created 1 Widget/w1 Warning Logging careful Widget/w1 Warning Logging broken Widget/w1]"},
		{"debug", "[Normal Logging details Widget/w1 Normal Logging created 1 Widget/w1 Warning Logging careful Widget/w1 Warning Logging broken Widget/w1]"},
		{"warning", "[Warning Logging careful Widget/w1 Warning Logging broken Widget/w1]"},
		{"error", "[Warning Logging broken Widget/w1]"},
		{"none", "[]"},
	}
	for _, tt := range tests {
		t.Run("level="+tt.level, func(t *testing.T) {
			k := &eventsKube{}
			rt := loadedRuntime(t, Options{Kube: k, LogEvents: tt.level}, "logs.lua", logEventsScript)
			mustInvoke(t, rt, "logs", createCause("u1"))
			if got := fmt.Sprint(k.posted()); got != tt.want {
				t.Errorf("posted %s\nwant   %s", got, tt.want)
			}
		})
	}
	if _, _, err := ParseLogEventsLevel("loud"); err == nil {
		t.Errorf("an unknown level is accepted")
	}
}

// Issue 12.16: luaop.adopt copies the owner's labels onto the child (kopf's adopt);
// labels the child already has win.
func TestAdoptCopiesTheOwnersLabels(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "adopt.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.create(R, function(ctx)
  local child = {apiVersion = "v1", kind = "ConfigMap", metadata = {labels = {tier = "db"}}}
  luaop.adopt(child)
  local bare = luaop.adopt({apiVersion = "v1", kind = "ConfigMap"})
  return {labels = child.metadata.labels, bare = bare.metadata.labels, ns = child.metadata.namespace,
          owner = child.metadata.ownerReferences[1].uid}
end, {id = "adopt"})
`)
	res := mustInvoke(t, rt, "adopt", createCause("u1"))
	got := fmt.Sprint(res.Value)
	want := "map[bare:map[app:x tier:web] labels:map[app:x tier:db] ns:ns1 owner:u1]"
	if got != want {
		t.Errorf("adopt gave %s\nwant      %s", got, want)
	}
}

// The other test clusters take the Events that ctx.logger posts (info and above by
// default) and drop them.
func (k *blockingKube) Event(context.Context, map[string]any, string, string, string) error {
	return nil
}

func (notFoundKube) Event(context.Context, map[string]any, string, string, string) error { return nil }

// Event spies and index functions log locally (kopf's local object logger): one run
// per watch event or per change must not post an Event each time.
func TestLoggerOfEventAndIndexHandlersPostsNoEvents(t *testing.T) {
	k := &eventsKube{}
	rt := loadedRuntime(t, Options{Kube: k}, "spy.lua", `local luaop = require("luaop")
local R = "example.com/v1/widgets"
luaop.on.event(R, function(ctx) ctx.logger.info("saw", ctx.type) end, {id = "spy"})
luaop.index(R, function(ctx) ctx.logger.warn("indexing"); return ctx.name end, {id = "names"})
`)
	cause := createCause("u1")
	cause.EventType = "MODIFIED"
	mustInvoke(t, rt, "spy", cause)
	mustInvoke(t, rt, "names", createCause("u1"))
	if got := k.posted(); len(got) != 0 {
		t.Errorf("posted %v from an event spy and an index function", got)
	}
}
