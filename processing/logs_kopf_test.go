package processing

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// jsonLog collects the operator's JSON log lines.
type jsonLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *jsonLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *jsonLog) lines() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(l.buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(s), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// kopf logs "Handler 'x' succeeded." for every kind of handler it runs, and a line
// when the DELETED event of an object it handled arrives ("Deleted, really deleted,
// and we are notified."). luaop's outcome lines are the same for every kind, with
// the fields handler, reason and took_ms in each: a log query finds any handler's
// runs the same way.
func TestEveryKindOfHandlerLogsItsOutcomeWithTheSameFields(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("created", causes.Create), nil)
	h.add(changeSpec("retried", causes.Create), func() handlerFunc {
		failed := false
		return func(context.Context, causes.Call) (causes.Result, error) {
			if !failed {
				failed = true
				return causes.Result{}, errors.New("not yet")
			}
			return causes.Result{}, nil
		}
	}())
	h.add(causes.Spec{ID: "spy", Kind: causes.KindEvent, Resource: widgets}, nil)
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: time.Minute}, nil)
	h.add(causes.Spec{ID: "names", Kind: causes.KindIndex, Resource: widgets}, func(context.Context, causes.Call) (causes.Result, error) {
		return causes.Result{Value: map[string]any{"w1": true}}, nil
	})
	h.addDaemon(causes.Spec{ID: "once", Resource: widgets}, func(context.Context, causes.Call) error { return nil })
	log := &jsonLog{}
	e := startEnv(t, h, Options{Logger: slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Lifecycle: LifecycleAllAtOnce})
	e.create("w1", nil)
	succeeded := func(id string) bool {
		for _, l := range log.lines() {
			if l["msg"] == "handler succeeded" && l["handler"] == id {
				return true
			}
		}
		return false
	}
	e.eventually("the first round", func() bool {
		return succeeded("created") && succeeded("spy") && succeeded("tick") && succeeded("names") && succeeded("once")
	})
	e.clock.Step(time.Minute) // the retry of "retried", the timer's next run
	e.eventually("the retry succeeded", func() bool { return succeeded("retried") })
	e.delete("w1")
	e.eventually("the deletion noticed", func() bool {
		for _, l := range log.lines() {
			if strings.HasPrefix(fmt.Sprint(l["msg"]), "deleted, really deleted") && l["name"] == "w1" && l["reason"] == "gone" {
				return true
			}
		}
		return false
	})
	reasons := map[string]string{"created": "create", "retried": "create", "spy": "event", "tick": "timer", "names": "index", "once": "daemon"}
	outcomes := 0
	for _, l := range log.lines() {
		msg := fmt.Sprint(l["msg"])
		if !strings.HasPrefix(msg, "handler succeeded") && !strings.HasPrefix(msg, "handler will be retried") && !strings.HasPrefix(msg, "handler failed") {
			continue
		}
		outcomes++
		id := fmt.Sprint(l["handler"])
		if _, isNumber := l["took_ms"].(float64); !isNumber || l["reason"] != reasons[id] || l["name"] != "w1" {
			t.Errorf("an outcome line without handler, reason %q, took_ms or the object: %v", reasons[id], l)
		}
	}
	if outcomes < 7 {
		t.Errorf("%d outcome lines, want one per run (7 at least)", outcomes)
	}
}
