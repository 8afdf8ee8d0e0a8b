package e2e

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// What Prometheus scrapes from a running operator: controller-runtime's reconcile
// metrics and client-go's work queue metrics named after the resource, luaop's
// handler runs and daemons, and the scripts' own metrics (luaop.metrics), whose
// counts go on across a reload. /debug's data shows the running daemon.
func TestMetricsOfARunningOperator(t *testing.T) {
	ns := env.Namespace(t)
	src := `
		local luaop = require("luaop")
		local greeted = luaop.metrics.counter("greeted_total", "Widgets greeted.", {"namespace"})
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			greeted:inc({namespace = ctx.namespace})
			return { message = "hi" }
		end, { id = "greet" })
		luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
			while not ctx.stopped() do luaop.sleep(60) end
		end, { id = "watch" })
	`
	m := metrics.New()
	opts := operator.Options{Scripts: script(src)}
	operator.Instrument(&opts.Processing, m)
	op := startWith(t, ns, opts)
	if err := op.AttachMetrics(m); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	scrape := func() string {
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w1}, spec: {size: 1}}")
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w2}, spec: {size: 2}}")
	waitField(t, widgets, ns, "w1", "status.greet.message", "hi")
	waitField(t, widgets, ns, "w2", "status.greet.message", "hi")

	const c = "widgets.examples.luaop.dev"
	want := []string{
		`luaop_script_greeted_total{namespace="` + ns + `"} 2`,
		`luaop_handler_runs_total{handler="greet",outcome="success",reason="create",resource="` + c + `"} 2`,
		`luaop_daemons_running{resource="` + c + `"} 2`,
		`controller_runtime_reconcile_errors_total{controller="` + c + `"} 0`,
		`controller_runtime_active_workers{controller="` + c + `"}`,
		`controller_runtime_max_concurrent_reconciles{controller="` + c + `"} 16`,
		`workqueue_depth{controller="` + c + `",name="` + c + `",priority=""}`,
		`workqueue_adds_total{controller="` + c + `",name="` + c + `"}`,
		`rest_client_requests_total{code="200",host="`,
	}
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		body := scrape()
		for _, w := range want {
			if !strings.Contains(body, w) {
				return false, "/metrics lacks " + w + "\n" + body
			}
		}
		if n := seriesValue(body, `controller_runtime_reconcile_total{controller="`+c+`",result="success"}`); n < 2 {
			return false, "fewer than 2 successful reconciles of widgets"
		}
		if n := seriesValue(body, `workqueue_adds_total{controller="`+c+`",name="`+c+`"}`); n < 2 {
			return false, "fewer than 2 adds to the widgets' queue"
		}
		return true, ""
	})

	// A reload registers the counter again: the same metric, its count goes on.
	if _, err := op.LoadScripts(t.Context(), script(src+"\n-- saved again\n")); err != nil {
		t.Fatal(err)
	}
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w3}, spec: {size: 3}}")
	waitField(t, widgets, ns, "w3", "status.greet.message", "hi")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		body := scrape()
		return strings.Contains(body, `luaop_script_greeted_total{namespace="`+ns+`"} 3`), "the scripts' counter after the reload:\n" + body
	})

	d := op.Debug()
	if len(d.Daemons) != 3 || d.Daemons[0].Handler != "watch" || d.Daemons[0].Resource != c {
		t.Errorf("Debug's daemons = %+v, want the 3 watch daemons", d.Daemons)
	}
}

// seriesValue reads the value of one series of a text exposition (-1 when absent).
func seriesValue(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}
