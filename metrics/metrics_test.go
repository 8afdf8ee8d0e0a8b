package metrics

import (
	"errors"
	"io"
	"math"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// scrape fetches the text exposition of m through its HTTP handler.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

func wantLines(t *testing.T, text string, lines ...string) {
	t.Helper()
	have := map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		have[l] = true
	}
	for _, l := range lines {
		if !have[l] {
			t.Errorf("missing line %q", l)
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", text)
	}
}

// value finds the value of one series in a text exposition.
func value(t *testing.T, text, series string) float64 {
	t.Helper()
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			return f
		}
	}
	t.Fatalf("no series %s in:\n%s", series, text)
	return 0
}

func TestRecordedSeries(t *testing.T) {
	m := New()
	m.HandlerRun("widgets.examples.luaop.dev", "greet", "create", "success", 30*time.Millisecond, false)
	m.HandlerRun("widgets.examples.luaop.dev", "greet", "create", "success", 2*time.Second, false)
	m.HandlerRun("widgets.examples.luaop.dev", "greet", "update", "retry", 400*time.Microsecond, true)
	m.EventReceived("widgets.examples.luaop.dev", "ADDED")
	m.EventReceived("widgets.examples.luaop.dev", "ADDED")
	m.EventReceived("widgets.examples.luaop.dev", "DELETED")
	m.PatchSent("widgets.examples.luaop.dev", "status", "ok")
	m.PatchSent("widgets.examples.luaop.dev", "", "conflict")
	m.Reload(true)
	m.Reload(true)
	m.Reload(false)

	text := scrape(t, m)
	const w = `resource="widgets.examples.luaop.dev"`
	wantLines(t, text,
		`luaop_handler_runs_total{handler="greet",outcome="success",reason="create",`+w+`} 2`,
		`luaop_handler_runs_total{handler="greet",outcome="retry",reason="update",`+w+`} 1`,
		`luaop_handler_duration_seconds_count{handler="greet",`+w+`} 3`,
		`luaop_handler_duration_seconds_bucket{handler="greet",`+w+`,le="0.0005"} 1`,
		`luaop_handler_duration_seconds_bucket{handler="greet",`+w+`,le="0.05"} 2`,
		`luaop_handler_duration_seconds_bucket{handler="greet",`+w+`,le="2.5"} 3`,
		`luaop_lua_errors_total{handler="greet",`+w+`} 1`,
		`luaop_events_received_total{`+w+`,type="ADDED"} 2`,
		`luaop_events_received_total{`+w+`,type="DELETED"} 1`,
		`luaop_patches_total{`+w+`,result="ok",subresource="status"} 1`,
		`luaop_patches_total{`+w+`,result="conflict",subresource=""} 1`,
		`luaop_reloads_total{result="ok"} 2`,
		`luaop_reloads_total{result="error"} 1`,
		`luaop_queue_depth 0`,
	)
	if sum := value(t, text, `luaop_handler_duration_seconds_sum{handler="greet",`+w+`}`); math.Abs(sum-2.0304) > 1e-9 {
		t.Errorf("duration sum %v, want 2.0304", sum)
	}
	for _, name := range []string{"go_goroutines", "go_memstats_alloc_bytes", "process_start_time_seconds"} {
		if !strings.Contains(text, "\n"+name+" ") {
			t.Errorf("the runtime and process collectors are missing %s", name)
		}
	}
}

func TestReloadsStartAtZero(t *testing.T) {
	wantLines(t, scrape(t, New()),
		`luaop_reloads_total{result="ok"} 0`,
		`luaop_reloads_total{result="error"} 0`,
		`luaop_reload_latency_seconds_count{result="ok"} 0`,
		`luaop_reload_latency_seconds_count{result="error"} 0`,
	)
}

func TestReloadLatencyHistogram(t *testing.T) {
	m := New()
	m.ReloadLatency(true, 32*time.Millisecond)
	m.ReloadLatency(true, 41*time.Millisecond)
	m.ReloadLatency(true, 120*time.Millisecond)
	m.ReloadLatency(false, 31*time.Millisecond)
	text := scrape(t, m)
	wantLines(t, text,
		`luaop_reload_latency_seconds_bucket{result="ok",le="0.025"} 0`,
		`luaop_reload_latency_seconds_bucket{result="ok",le="0.035"} 1`,
		`luaop_reload_latency_seconds_bucket{result="ok",le="0.05"} 2`,
		`luaop_reload_latency_seconds_bucket{result="ok",le="0.15"} 3`,
		`luaop_reload_latency_seconds_count{result="ok"} 3`,
		`luaop_reload_latency_seconds_count{result="error"} 1`,
	)
	if sum := value(t, text, `luaop_reload_latency_seconds_sum{result="ok"}`); math.Abs(sum-0.193) > 1e-9 {
		t.Errorf("latency sum %v, want 0.193", sum)
	}
}

func TestWorkqueueProvider(t *testing.T) {
	m := New()
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "luaop", MetricsProvider: m.WorkqueueProvider()},
	)
	defer q.ShutDown()
	q.Add("a")
	q.Add("b")
	q.Add("a") // already queued: neither an add nor in the depth
	item, _ := q.Get()
	q.Done(item)
	q.AddRateLimited("c") // waits an hour: a retry, not in the depth

	text := scrape(t, m)
	wantLines(t, text,
		`workqueue_depth{controller="luaop",name="luaop",priority=""} 1`,
		`luaop_queue_depth 1`,
		`workqueue_adds_total{controller="luaop",name="luaop"} 2`,
		`workqueue_retries_total{controller="luaop",name="luaop"} 1`,
		`workqueue_queue_duration_seconds_count{controller="luaop",name="luaop"} 1`,
		`workqueue_work_duration_seconds_count{controller="luaop",name="luaop"} 1`,
		`workqueue_unfinished_work_seconds{controller="luaop",name="luaop"} 0`,
		`workqueue_longest_running_processor_seconds{controller="luaop",name="luaop"} 0`,
	)
}

// Two Metrics live side by side, and the global default registry stays untouched.
func TestOwnRegistries(t *testing.T) {
	a, b := New(), New()
	a.Reload(true)
	if strings.Contains(scrape(t, b), `luaop_reloads_total{result="ok"} 1`) {
		t.Error("a reload recorded in one Metrics shows in another")
	}
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "luaop_") || strings.HasPrefix(f.GetName(), "workqueue_") {
			t.Errorf("%s is registered in the global default registry", f.GetName())
		}
	}
}

// controller-runtime's names and labels, as dashboards built for kubebuilder
// operators query them.
func TestControllerRuntimeSeries(t *testing.T) {
	m := New()
	const c = "widgets.examples.luaop.dev"
	m.MaxConcurrentReconciles(c, 16)
	m.ReconcileStarted(c)
	m.ReconcileStarted(c)
	m.ReconcileFinished(c, "success", 30*time.Millisecond)
	m.ReconcileStarted(c)
	m.ReconcileFinished(c, "error", 2*time.Second)
	text := scrape(t, m)
	wantLines(t, text,
		`controller_runtime_max_concurrent_reconciles{controller="`+c+`"} 16`,
		`controller_runtime_active_workers{controller="`+c+`"} 1`,
		`controller_runtime_reconcile_total{controller="`+c+`",result="success"} 1`,
		`controller_runtime_reconcile_total{controller="`+c+`",result="error"} 1`,
		`controller_runtime_reconcile_total{controller="`+c+`",result="requeue_after"} 0`,
		`controller_runtime_reconcile_errors_total{controller="`+c+`"} 1`,
		`controller_runtime_reconcile_time_seconds_count{controller="`+c+`"} 2`,
		`controller_runtime_reconcile_time_seconds_bucket{controller="`+c+`",le="0.05"} 1`,
	)
}

func TestReloadFailedGaugeAndBuildInfo(t *testing.T) {
	m := New()
	m.BuildInfo("v1.2.3")
	m.Reload(true)
	text := scrape(t, m)
	wantLines(t, text, `luaop_scripts_reload_failed 0`,
		`luaop_build_info{goversion="`+runtime.Version()+`",version="v1.2.3"} 1`)
	ok := value(t, text, "luaop_scripts_last_reload_success_timestamp_seconds")
	if ok < float64(time.Now().Add(-time.Hour).Unix()) {
		t.Errorf("luaop_scripts_last_reload_success_timestamp_seconds = %v, want about now", ok)
	}
	m.Reload(false)
	text = scrape(t, m)
	wantLines(t, text, `luaop_scripts_reload_failed 1`)
	if got := value(t, text, "luaop_scripts_last_reload_success_timestamp_seconds"); got != ok {
		t.Errorf("a failed reload moved the last success time: %v, was %v", got, ok)
	}
}

func TestEngineCountsAreReadAtScrape(t *testing.T) {
	m := New()
	daemons := 1
	m.EngineCounts(func() (map[string]int, map[string]int) {
		return map[string]int{"monitors.examples.luaop.dev": daemons}, map[string]int{"quotas.examples.luaop.dev": 2}
	})
	wantLines(t, scrape(t, m), `luaop_daemons_running{resource="monitors.examples.luaop.dev"} 1`,
		`luaop_timers_scheduled{resource="quotas.examples.luaop.dev"} 2`)
	daemons = 3
	wantLines(t, scrape(t, m), `luaop_daemons_running{resource="monitors.examples.luaop.dev"} 3`)
}

// brokenCollector sends one metric that fails to gather.
type brokenCollector struct{}

func (brokenCollector) Describe(chan<- *prometheus.Desc) {}
func (brokenCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.NewInvalidMetric(prometheus.NewDesc("luaop_script_broken", "h", nil, nil), errors.New("broken on purpose"))
}

// A collector that fails (the scripts' metrics, say) does not hide luaop's own: the
// scrape succeeds with every other series.
func TestFailingCollectorKeepsOwnSeries(t *testing.T) {
	m := New()
	m.Reload(true)
	if err := m.Registry().Register(brokenCollector{}); err != nil {
		t.Fatal(err)
	}
	wantLines(t, scrape(t, m), `luaop_reloads_total{result="ok"} 1`)
}

// controller-runtime's terminal-error, panic and webhook series, as its dashboards
// and alerts query them.
func TestControllerRuntimeErrorAndWebhookSeries(t *testing.T) {
	m := New()
	const c = "widgets.examples.luaop.dev"
	m.MaxConcurrentReconciles(c, 4)
	text := scrape(t, m)
	wantLines(t, text,
		`controller_runtime_terminal_reconcile_errors_total{controller="`+c+`"} 0`,
		`controller_runtime_reconcile_panics_total{controller="`+c+`"} 0`,
	)
	m.TerminalError(c)
	m.ReconcilePanicked(c)
	const hook = "/fail/validate/check-size"
	m.WebhookStarted(hook)
	m.WebhookStarted(hook)
	m.WebhookFinished(hook, 200, 3*time.Millisecond)
	text = scrape(t, m)
	wantLines(t, text,
		`controller_runtime_terminal_reconcile_errors_total{controller="`+c+`"} 1`,
		`controller_runtime_reconcile_panics_total{controller="`+c+`"} 1`,
		`controller_runtime_webhook_requests_total{code="200",webhook="`+hook+`"} 1`,
		`controller_runtime_webhook_requests_in_flight{webhook="`+hook+`"} 1`,
		`controller_runtime_webhook_latency_seconds_count{webhook="`+hook+`"} 1`,
	)
}

func TestPeeringAndWebhookGauges(t *testing.T) {
	m := New()
	text := scrape(t, m)
	wantLines(t, text, `luaop_peering_paused 0`, `luaop_peering_peers 0`)
	if strings.Contains(text, "luaop_webhook_reachable") {
		t.Error("luaop_webhook_reachable is there before any probe")
	}
	m.Peering(true, 1)
	m.WebhookReachable(false)
	wantLines(t, scrape(t, m), `luaop_peering_paused 1`, `luaop_peering_peers 1`, `luaop_webhook_reachable 0`)
	m.WebhookReachable(true)
	wantLines(t, scrape(t, m), `luaop_webhook_reachable 1`)
}

// luaop_certificate_expiry_timestamp_seconds reads each certificate's expiry at the
// scrape (a renewal shows at the next one), one series per certificate.
func TestCertificateExpiry(t *testing.T) {
	m := New()
	var notAfter atomic.Int64 // read by the scrape's goroutine
	notAfter.Store(2000000000)
	m.Certificate("webhook", func() time.Time { return time.Unix(notAfter.Load(), 0) })
	m.Certificate("metrics", func() time.Time { return time.Unix(1900000000, 0) })
	wantLines(t, scrape(t, m),
		`luaop_certificate_expiry_timestamp_seconds{certificate="webhook"} 2e+09`,
		`luaop_certificate_expiry_timestamp_seconds{certificate="metrics"} 1.9e+09`)
	notAfter.Store(2100000000) // renewed
	wantLines(t, scrape(t, m), `luaop_certificate_expiry_timestamp_seconds{certificate="webhook"} 2.1e+09`)
	if !slices.Contains(m.Names(), "luaop_certificate_expiry_timestamp_seconds") {
		t.Error("Names lacks luaop_certificate_expiry_timestamp_seconds: alerts on it would fail the deploy tests")
	}
}
