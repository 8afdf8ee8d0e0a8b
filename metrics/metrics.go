package metrics

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/tools/leaderelection"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// HandlerDurationBuckets are the buckets of luaop_handler_duration_seconds: Lua
// handlers take from well under a millisecond to the handler timeout.
var HandlerDurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// ReloadLatencyBuckets are the buckets of luaop_reload_latency_seconds: from a save
// to the new handlers active takes the watcher's debounce (30ms) plus the load, a
// few ms for a handful of files and tens of ms for thousands.
var ReloadLatencyBuckets = []float64{0.01, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10}

// ReconcileTimeBuckets are controller-runtime's buckets of
// controller_runtime_reconcile_time_seconds.
var ReconcileTimeBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
	1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60}

// Metrics holds the collectors of one operator and the registry they live in.
type Metrics struct {
	registry *prometheus.Registry

	reconciles        *prometheus.CounterVec
	reconcileErrors   *prometheus.CounterVec
	terminalErrors    *prometheus.CounterVec
	reconcilePanics   *prometheus.CounterVec
	webhookRequests   *prometheus.CounterVec
	webhookLatency    *prometheus.HistogramVec
	webhookInFlight   *prometheus.GaugeVec
	reconcileTime     *prometheus.HistogramVec
	activeWorkers     *prometheus.GaugeVec
	maxConcurrent     *prometheus.GaugeVec
	handlerRuns       *prometheus.CounterVec
	handlerDuration   *prometheus.HistogramVec
	luaErrors         *prometheus.CounterVec
	events            *prometheus.CounterVec
	patches           *prometheus.CounterVec
	reloads           *prometheus.CounterVec
	reloadLatency     *prometheus.HistogramVec
	reloadFailed      prometheus.Gauge
	lastReload        prometheus.Gauge
	lastReloadSuccess prometheus.Gauge
	buildInfo         *prometheus.GaugeVec
	queueDepth        prometheus.Gauge
	peeringPaused     prometheus.Gauge
	peeringPeers      prometheus.Gauge
	webhookReachable  prometheus.Gauge
	engines           *engineCollector
	certificates      *certificatesCollector

	queue queueMetrics
	// collectors are those registered, for Names; histograms, those of them that
	// are histogram families (Names lists their series before any observation).
	collectors []prometheus.Collector
	histograms []*prometheus.HistogramVec
	// sharding is registered at its first report (sharding.go).
	sharding shardingMetrics
	// webhookOnce registers webhookReachable at the first probe.
	webhookOnce sync.Once
}

// New makes a registry and registers luaop's metrics, the workqueue metrics, and
// the Go runtime and process collectors in it.
func New() *Metrics {
	registerClientGoHooks()
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		// Registered at the first probe (WebhookReachable): absent before.
		webhookReachable: newGauge("luaop_webhook_reachable",
			"1 when the last reachability probe proved that the API server calls the webhook server, 0 when it did not (absent before the first probe)."),
		engines:      newEngineCollector(),
		certificates: newCertificatesCollector(),
		queue:        newQueueMetrics(),
	}
	m.registerReconcileMetrics()
	m.registerWebhookMetrics()
	m.registerHandlerMetrics()
	m.registerReloadMetrics()
	m.registerOperatorMetrics()
	m.register(
		m.engines, m.certificates,
		restRequests, leaderStatus, leaderSlowpath,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.queue.register(m.register)
	return m
}

// registerReconcileMetrics: controller-runtime's reconcile metrics, one cycle of
// one object being one reconcile and a resource (plural.group) a controller.
func (m *Metrics) registerReconcileMetrics() {
	m.reconciles = m.counter("controller_runtime_reconcile_total",
		"Total number of reconciliations (cycles of one object) per controller (resource, as plural.group) and result (success, error, requeue_after).",
		"controller", "result")
	m.reconcileErrors = m.counter("controller_runtime_reconcile_errors_total",
		"Total number of reconciliation errors per controller: errors of the framework (a failed patch), not failed handlers (see luaop_handler_runs_total).",
		"controller")
	m.terminalErrors = m.counter("controller_runtime_terminal_reconcile_errors_total",
		"Total number of terminal reconciliation errors per controller: handlers that failed for good (luaop.permanent_error, retries or timeout exhausted), which are not retried.",
		"controller")
	m.reconcilePanics = m.counter("controller_runtime_reconcile_panics_total",
		"Total number of reconciliation panics per controller (a bug of the framework, recovered: the object is retried, the others keep being served).",
		"controller")
	m.reconcileTime = m.histogram("controller_runtime_reconcile_time_seconds",
		"Length of time per reconciliation per controller.",
		ReconcileTimeBuckets, "controller")
	m.activeWorkers = m.gaugeVec("controller_runtime_active_workers",
		"Number of currently used workers per controller.",
		"controller")
	m.maxConcurrent = m.gaugeVec("controller_runtime_max_concurrent_reconciles",
		"Maximum number of concurrent reconciles per controller (--workers, shared by all resources).",
		"controller")
}

// registerWebhookMetrics: controller-runtime's webhook metrics, per webhook path.
func (m *Metrics) registerWebhookMetrics() {
	m.webhookRequests = m.counter("controller_runtime_webhook_requests_total",
		"Total number of admission requests by HTTP status code, per webhook path.",
		"webhook", "code")
	m.webhookLatency = m.histogram("controller_runtime_webhook_latency_seconds",
		"Histogram of the latency of processing admission requests, per webhook path.",
		prometheus.DefBuckets, "webhook")
	m.webhookInFlight = m.gaugeVec("controller_runtime_webhook_requests_in_flight",
		"Current number of admission requests being served, per webhook path.",
		"webhook")
}

// registerHandlerMetrics: luaop's handler runs, Lua errors, watch events and
// patches.
func (m *Metrics) registerHandlerMetrics() {
	m.handlerRuns = m.counter("luaop_handler_runs_total",
		"Handler attempts, by resource, handler id (the top-level handler's for subhandlers), reason (create, update, delete, resume, event, daemon, timer...) and outcome (success, retry, failure, ignored).",
		"resource", "handler", "reason", "outcome")
	m.handlerDuration = m.histogram("luaop_handler_duration_seconds",
		"How long handler attempts took.",
		HandlerDurationBuckets, "resource", "handler")
	m.luaErrors = m.counter("luaop_lua_errors_total",
		"Handler attempts that failed with a Lua error (a raised error, a runtime error or a timeout; not luaop.temporary_error or luaop.permanent_error), by resource and handler.",
		"resource", "handler")
	m.events = m.counter("luaop_events_received_total",
		"Watch notifications received, by resource and type (ADDED, MODIFIED, DELETED).",
		"resource", "type")
	m.patches = m.counter("luaop_patches_total",
		"Patches sent to the API server, by resource, subresource (\"status\", or empty for the object) and result.",
		"resource", "subresource", "result")
}

// registerReloadMetrics: the loads of the scripts.
func (m *Metrics) registerReloadMetrics() {
	m.reloads = m.counter("luaop_reloads_total",
		"Script loads, by result (ok, error).",
		"result")
	m.reloadLatency = m.histogram("luaop_reload_latency_seconds",
		"Reloads of the scripts while running, by result (ok, error): from the first file event of a save to the new handlers being active (or the error known).",
		ReloadLatencyBuckets, "result")
	m.reloadFailed = m.gauge("luaop_scripts_reload_failed",
		"1 when the last load of the scripts failed (the previous scripts keep running), 0 when it succeeded.")
	m.lastReload = m.gauge("luaop_scripts_last_reload_timestamp_seconds",
		"When the scripts were last loaded or reloaded, successfully or not (Unix time).")
	m.lastReloadSuccess = m.gauge("luaop_scripts_last_reload_success_timestamp_seconds",
		"When the scripts were last loaded or reloaded successfully (Unix time).")
	// Both results exist from the start, so that rate() and alerts see a zero.
	for _, result := range []string{"ok", "error"} {
		m.reloads.WithLabelValues(result)
		m.reloadLatency.WithLabelValues(result)
	}
}

// registerOperatorMetrics: the build, the queue, peering.
func (m *Metrics) registerOperatorMetrics() {
	m.buildInfo = m.gaugeVec("luaop_build_info",
		"Always 1: luaop's version and the Go version it was built with.",
		"version", "goversion")
	m.queueDepth = m.gauge("luaop_queue_depth",
		"Objects waiting in the processing queue, all resources together (the sum of workqueue_depth).")
	m.peeringPaused = m.gauge("luaop_peering_paused",
		"1 while this operator is paused by peering (another operator of its prefix with a higher or the same priority serves the same resources), else 0.")
	m.peeringPeers = m.gauge("luaop_peering_peers",
		"Live operators of the same prefix serving some of the same resources (peering).")
}

func (m *Metrics) register(cs ...prometheus.Collector) {
	m.registry.MustRegister(cs...)
	m.collectors = append(m.collectors, cs...)
}

// counter, gaugeVec, gauge and histogram make a family and register it.
func (m *Metrics) counter(name, help string, labels ...string) *prometheus.CounterVec {
	c := newCounterVec(name, help, labels...)
	m.register(c)
	return c
}

func (m *Metrics) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	g := newGaugeVec(name, help, labels...)
	m.register(g)
	return g
}

func (m *Metrics) gauge(name, help string) prometheus.Gauge {
	g := newGauge(name, help)
	m.register(g)
	return g
}

func (m *Metrics) histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := newHistogramVec(name, help, buckets, labels...)
	m.register(h)
	m.histograms = append(m.histograms, h)
	return h
}

// newCounterVec, newGaugeVec, newGauge and newHistogramVec make a family without
// registering it: for the families registered later (at their first report) or
// elsewhere (shared by every Metrics).
func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func newGaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func newHistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
}

// fqName reads a Desc's name (client_golang has no accessor but its String).
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names are the names of the series luaop serves (the scripts' own, luaop_script_*,
// aside), histograms with their _bucket, _sum and _count series, sorted: what
// dashboards and alerts may query.
func (m *Metrics) Names() []string {
	set := map[string]bool{}
	// luaop_webhook_reachable is registered at the first probe: served from then on.
	for _, c := range append(append(slices.Clone(m.collectors), m.webhookReachable), m.shardCollectors().all()...) {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if n := fqName.FindStringSubmatch(d.String()); n != nil {
				set[n[1]] = true
			}
		}
	}
	// Histograms: the series of a family named NAME are NAME_bucket, _sum, _count.
	mfs, _ := m.registry.Gather()
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM || mf.GetType() == dto.MetricType_SUMMARY {
			set[mf.GetName()+"_sum"], set[mf.GetName()+"_count"] = true, true
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				set[mf.GetName()+"_bucket"] = true
			}
		}
	}
	for _, h := range append([]prometheus.Collector{m.queue.latency, m.queue.workDuration, m.shardCollectors().rebalance}, histogramCollectors(m.histograms)...) {
		ch := make(chan *prometheus.Desc, 1)
		h.Describe(ch)
		if n := fqName.FindStringSubmatch((<-ch).String()); n != nil {
			set[n[1]+"_bucket"], set[n[1]+"_sum"], set[n[1]+"_count"] = true, true, true
		}
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func histogramCollectors(hs []*prometheus.HistogramVec) []prometheus.Collector {
	out := make([]prometheus.Collector, len(hs))
	for i, h := range hs {
		out[i] = h
	}
	return out
}

// client-go reports REST requests and leader election through process-wide hooks
// that can be set once: these collectors are shared by every Metrics.
var (
	restRequests = newCounterVec("rest_client_requests_total",
		"Number of HTTP requests to the API server, partitioned by status code, method, and host.",
		"code", "method", "host")
	leaderStatus = newGaugeVec("leader_election_master_status",
		"Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
		"name")
	leaderSlowpath = newCounterVec("leader_election_slowpath_total",
		"Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
		"name")
	hooksOnce sync.Once
)

// init installs client-go's hooks before any client of the process exists (as
// controller-runtime's metrics package does): set later, they race the requests of
// clients already running (the race detector sees it in tests that make a client
// before they start an operator).
func init() { registerClientGoHooks() }

func registerClientGoHooks() {
	hooksOnce.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: restResult{}})
		leaderelection.SetProvider(leaderProvider{})
	})
}

type restResult struct{}

func (restResult) Increment(_ context.Context, code, method, host string) {
	restRequests.WithLabelValues(code, method, host).Inc()
}

type leaderProvider struct{}

func (leaderProvider) NewLeaderMetric() leaderelection.LeaderMetric { return leaderMetric{} }

type leaderMetric struct{}

func (leaderMetric) On(name string)                { leaderStatus.WithLabelValues(name).Set(1) }
func (leaderMetric) Off(name string)               { leaderStatus.WithLabelValues(name).Set(0) }
func (leaderMetric) SlowpathExercised(name string) { leaderSlowpath.WithLabelValues(name).Inc() }

// BuildInfo sets luaop_build_info{version, goversion} to 1.
func (m *Metrics) BuildInfo(version string) {
	m.buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
}

// ReconcileStarted, ReconcileFinished and MaxConcurrentReconciles feed
// controller-runtime's metrics (processing.ReconcileObserver).
func (m *Metrics) ReconcileStarted(controller string) {
	m.activeWorkers.WithLabelValues(controller).Inc()
}

func (m *Metrics) ReconcileFinished(controller, result string, d time.Duration) {
	m.activeWorkers.WithLabelValues(controller).Dec()
	m.reconciles.WithLabelValues(controller, result).Inc()
	if result == "error" {
		m.reconcileErrors.WithLabelValues(controller).Inc()
	}
	m.reconcileTime.WithLabelValues(controller).Observe(d.Seconds())
}

func (m *Metrics) MaxConcurrentReconciles(controller string, n int) {
	m.maxConcurrent.WithLabelValues(controller).Set(float64(n))
	// Every result exists from the start, so that rate() and alerts see a zero.
	for _, result := range []string{"success", "error", "requeue_after"} {
		m.reconciles.WithLabelValues(controller, result)
	}
	m.reconcileErrors.WithLabelValues(controller)
	m.terminalErrors.WithLabelValues(controller)
	m.reconcilePanics.WithLabelValues(controller)
	m.activeWorkers.WithLabelValues(controller)
}

// ReconcilePanicked counts a panic recovered while processing an object of the
// controller (processing.PanicObserver).
func (m *Metrics) ReconcilePanicked(controller string) {
	m.reconcilePanics.WithLabelValues(controller).Inc()
}

// TerminalError counts a handler of the controller that failed for good.
func (m *Metrics) TerminalError(controller string) {
	m.terminalErrors.WithLabelValues(controller).Inc()
}

// WebhookStarted and WebhookFinished bracket one admission request of a webhook
// path (admission.RequestObserver): controller-runtime's webhook metrics.
func (m *Metrics) WebhookStarted(webhook string) {
	m.webhookInFlight.WithLabelValues(webhook).Inc()
}

func (m *Metrics) WebhookFinished(webhook string, code int, d time.Duration) {
	m.webhookInFlight.WithLabelValues(webhook).Dec()
	m.webhookRequests.WithLabelValues(webhook, strconv.Itoa(code)).Inc()
	m.webhookLatency.WithLabelValues(webhook).Observe(d.Seconds())
}

// EngineCounts sets where luaop_daemons_running and luaop_timers_scheduled are read
// from at every scrape: the number of daemons running and of timers scheduled, by
// resource.
func (m *Metrics) EngineCounts(counts func() (daemons, timers map[string]int)) {
	m.engines.set(counts)
}

// Registry is the registry of these metrics, to add collectors of one's own.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the metrics in the Prometheus exposition formats (mount it at
// /metrics). A collector that fails (such as two of the scripts' metrics whose
// series share a name) loses only its own series: the rest, luaop's own among them,
// are still served, and promhttp_metric_handler_errors_total{cause="gathering"}
// counts the failures.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{
		Registry:      m.registry,
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      gatherErrorLog{},
	})
}

// gatherErrorLog logs the errors of a scrape with slog.
type gatherErrorLog struct{}

func (gatherErrorLog) Println(v ...any) {
	slog.Warn("serving /metrics without the series of a failing collector", "error", fmt.Sprint(v...))
}

// HandlerRun records one finished handler attempt; isLuaError tells whether it
// failed with an error of the Lua code (luabind.ScriptError).
func (m *Metrics) HandlerRun(resource, handler, reason, outcome string, d time.Duration, isLuaError bool) {
	m.handlerRuns.WithLabelValues(resource, handler, reason, outcome).Inc()
	m.handlerDuration.WithLabelValues(resource, handler).Observe(d.Seconds())
	if isLuaError {
		m.luaErrors.WithLabelValues(resource, handler).Inc()
	}
}

// EventReceived records one watch notification of a resource (ADDED, MODIFIED,
// DELETED).
func (m *Metrics) EventReceived(resource, eventType string) {
	m.events.WithLabelValues(resource, eventType).Inc()
}

// PatchSent records one patch request: subresource is "status" or "" (the object),
// result a short word such as "ok", "not_found", "conflict", "invalid", "error".
func (m *Metrics) PatchSent(resource, subresource, result string) {
	m.patches.WithLabelValues(resource, subresource, result).Inc()
}

// Peering records peering's state: paused or not, and how many live peers serve
// some of the same resources.
func (m *Metrics) Peering(paused bool, peers int) {
	m.peeringPaused.Set(boolGauge(paused))
	m.peeringPeers.Set(float64(peers))
}

// WebhookReachable records the outcome of a reachability probe of the webhook
// server (the gauge is registered at the first probe: absent before).
func (m *Metrics) WebhookReachable(reachable bool) {
	m.webhookOnce.Do(func() { m.registry.MustRegister(m.webhookReachable) })
	m.webhookReachable.Set(boolGauge(reachable))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Reload records one load of the scripts (the first one included).
func (m *Metrics) Reload(ok bool) {
	now := float64(time.Now().UnixNano()) / 1e9
	m.lastReload.Set(now)
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
		m.reloadFailed.Set(0)
		m.lastReloadSuccess.Set(now)
	} else {
		m.reloads.WithLabelValues("error").Inc()
		m.reloadFailed.Set(1)
	}
}

// ReloadLatency records how long one reload while running took, from the first file
// event of the save to the new handlers being active (reloading.Event.Latency).
// The initial load, with no save to start from, is not recorded.
func (m *Metrics) ReloadLatency(ok bool, d time.Duration) {
	result := "ok"
	if !ok {
		result = "error"
	}
	m.reloadLatency.WithLabelValues(result).Observe(d.Seconds())
}

// engineCollector reports the daemons and timers counted at scrape time.
type engineCollector struct {
	daemons, timers *prometheus.Desc
	mu              sync.Mutex // leaf: guards counts
	counts          func() (daemons, timers map[string]int)
}

func newEngineCollector() *engineCollector {
	return &engineCollector{
		daemons: prometheus.NewDesc("luaop_daemons_running", "Daemons running (or stopping), by resource.", []string{"resource"}, nil),
		timers:  prometheus.NewDesc("luaop_timers_scheduled", "Timers scheduled on objects, by resource.", []string{"resource"}, nil),
	}
}

func (c *engineCollector) set(counts func() (daemons, timers map[string]int)) {
	c.mu.Lock()
	c.counts = counts
	c.mu.Unlock()
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.daemons; ch <- c.timers }

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	counts := c.counts
	c.mu.Unlock()
	if counts == nil {
		return
	}
	daemons, timers := counts()
	for r, n := range daemons {
		ch <- prometheus.MustNewConstMetric(c.daemons, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range timers {
		ch <- prometheus.MustNewConstMetric(c.timers, prometheus.GaugeValue, float64(n), r)
	}
}
