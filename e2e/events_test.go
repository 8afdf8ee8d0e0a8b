package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// A handler that retries quickly and calls luaop.warn on every attempt does not flood
// the API server: its Events and the framework's HandlerRetrying ones share one
// recorder, whose correlator lets a burst of 25 Warning Events per object through and
// aggregates repeats (a count on one Event, or one "combined from similar events").
func TestRetryingHandlerEventsAreRateLimited(t *testing.T) {
	ns := env.Namespace(t)
	const attempts = 40
	startWith(t, ns, postingEvents(script(fmt.Sprintf(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			assert(luaop.warn(ctx.body, "Flaky", "attempt " .. ctx.retry .. ": the backend does not answer"))
			if ctx.retry < %d then error(luaop.temporary_error("not yet", 0.01)) end
			return "done"
		end, { id = "flaky" })
	`, attempts))))
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		status, _ := get(t, widgets, ns, "w").Object["status"].(map[string]any)
		return status["flaky"] == "done", fmt.Sprintf("the handler has not succeeded yet (status %v)", status)
	})

	// Events are written asynchronously, but in order: the recorder hands them to one
	// goroutine that correlates and writes them one by one. The success Event (a Normal
	// one, not limited by the Warning burst) is the last one posted, so once it is on
	// the server every Warning before it has been written or dropped.
	events := func() []corev1.Event {
		list, err := env.Kube.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []corev1.Event
		for _, e := range list.Items {
			if e.InvolvedObject.Name == "w" {
				out = append(out, e)
			}
		}
		return out
	}
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		for _, e := range events() {
			if e.Reason == "HandlerSucceeded" {
				return true, ""
			}
		}
		return false, "no HandlerSucceeded Event yet"
	})

	var warnings, warningCount, flakyCount int32
	aggregated := false
	var table strings.Builder
	for _, e := range events() {
		fmt.Fprintf(&table, "\n  %-7s %-16s count %-3d %s", e.Type, e.Reason, e.Count, e.Message)
		if e.Type != corev1.EventTypeWarning {
			continue
		}
		warnings++
		warningCount += e.Count
		if e.Reason == "Flaky" {
			flakyCount += e.Count
		}
		if e.Count > 1 || strings.HasPrefix(e.Message, "(combined from similar events)") {
			aggregated = true
		}
	}
	t.Logf("%d attempts, each posting a Flaky and a HandlerRetrying Warning; Events about w:%s", attempts, table.String())
	const burst = 25
	if flakyCount == 0 {
		t.Errorf("none of the script's Flaky Events was posted")
	}
	if warningCount > burst || warnings > burst {
		t.Errorf("%d Warning Events counting %d posts; want at most the burst of %d", warnings, warningCount, burst)
	}
	if !aggregated {
		t.Errorf("no Warning Event aggregates repeats (count > 1 or combined from similar events)")
	}
}

// Issue 12.16: with --log-events-level info, ctx.logger messages at info and above
// are posted as Events of the object (kopf's object logger); debug ones are not.
// (None is posted by default: issue 45, kopf's posting.loggers=False.)
func TestLoggerInfoIsPostedAsAnEventOfTheObject(t *testing.T) {
	ns := env.Namespace(t)
	opts := postingEvents(script(`
		local luaop = require("luaop")
		luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx)
			ctx.logger.debug("quiet detail")
			ctx.logger.info("provisioned", ctx.spec.size)
			ctx.logger.warn("running low")
		end, {id = "provision"})
	`))
	opts.Runtime.LogEvents = "info"
	startWith(t, ns, opts)
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {size: 3}}")
	var seen []string
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		list, err := env.Kube.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		seen = nil
		for _, e := range list.Items {
			if e.InvolvedObject.Name == "g" && e.InvolvedObject.Kind == "Gadget" && e.Reason == "Logging" {
				seen = append(seen, e.Type+" "+e.Message)
			}
		}
		has := func(s string) bool {
			for _, x := range seen {
				if x == s {
					return true
				}
			}
			return false
		}
		return has("Normal provisioned 3") && has("Warning running low"), fmt.Sprintf("Logging Events of the gadget: %q", seen)
	})
	for _, x := range seen {
		if strings.Contains(x, "quiet detail") {
			t.Errorf("a debug message was posted: %q", seen)
		}
	}
}

// postingEvents runs the scripts with the posting of Events on (an operator's
// default; the tests' operators post none unless asked).
func postingEvents(scripts []luabind.Script) operator.Options {
	post := true
	return operator.Options{Processing: processing.Options{PostEvents: &post}, Scripts: scripts}
}
