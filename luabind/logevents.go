package luabind

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/processing/causes"
)

// LogEventsNone is the LogEvents level that posts no Event for ctx.logger messages.
const LogEventsNone = "none"

// LogEventsReason is the reason of the Events posted for ctx.logger messages (kopf's).
const LogEventsReason = "Logging"

// ParseLogEventsLevel reads a LogEvents setting: debug, info, warning (or warn),
// error, or none (also ""): ok is false for none. None is the default, kopf's since
// 1.41 (settings.posting.loggers = False): a ctx.logger.info in a timer posted an
// Event at every tick.
func ParseLogEventsLevel(s string) (level slog.Level, ok bool, err error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "info":
		return slog.LevelInfo, true, nil
	case "debug":
		return slog.LevelDebug, true, nil
	case "warning", "warn":
		return slog.LevelWarn, true, nil
	case "error":
		return slog.LevelError, true, nil
	case "", LogEventsNone:
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("log events level %q: use debug, info, warning, error or none", s)
}

// postLogEvent posts a ctx.logger message at or above Options.LogEvents (when it
// names a level: none by default) as a
// Kubernetes Event of the object being handled, as kopf's object logger does: Normal
// below warning, Warning from it on, reason "Logging". The Event goes through the
// cluster client (the operator's shared, rate-limited recorder), with the shard
// released meanwhile (no lock held while calling out). Calls without an object
// (operator hooks) post nothing; so does a runtime without a cluster client.
func (s *shard) postLogEvent(L *lua.LState, level slog.Level, message string) {
	threshold, on, err := ParseLogEventsLevel(s.rt.opts.LogEvents)
	if err != nil || !on || level < threshold || s.rt.opts.Kube == nil {
		return
	}
	cs := s.callOf(L)
	if cs == nil {
		return
	}
	if k := cs.call.Handler.Kind; k == causes.KindEvent || k == causes.KindIndex {
		// kopf gives these a local logger: a spy that logs on every watch event, or
		// an index function run on every change, must not post an Event each time.
		return
	}
	body := cs.body()
	if kind, _ := body["kind"].(string); kind == "" {
		return
	}
	eventType := "Normal"
	if level >= slog.LevelWarn {
		eventType = "Warning"
	}
	k := s.rt.opts.Kube
	s.blocking(L, func(ctx context.Context) {
		if err := k.Event(ctx, body, eventType, LogEventsReason, message); err != nil {
			s.rt.opts.Logger.Debug("posting a log message as an Event failed", "error", err)
		}
	})
}
