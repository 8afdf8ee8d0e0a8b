// Package metrics exposes luaop's Prometheus metrics: handler runs, watch events,
// patches, script reloads, the processing queue (through client-go's workqueue
// metrics), and the Go runtime and process collectors.
//
// Every Metrics has a registry of its own: nothing is registered with the global
// default registry, and two operators in one process (tests) do not collide.
// All methods are safe for concurrent use.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// HandlerDurationBuckets are the buckets of luaop_handler_duration_seconds: Lua
// handlers take from well under a millisecond to the handler timeout.
var HandlerDurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// ReloadLatencyBuckets are the buckets of luaop_reload_latency_seconds: from a save
// to the new handlers active takes the watcher's debounce (30ms) plus the load, a
// few ms for a handful of files and tens of ms for thousands.
var ReloadLatencyBuckets = []float64{0.01, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10}

// Metrics holds the collectors of one operator and the registry they live in.
type Metrics struct {
	registry *prometheus.Registry

	handlerRuns     *prometheus.CounterVec
	handlerDuration *prometheus.HistogramVec
	luaErrors       *prometheus.CounterVec
	events          *prometheus.CounterVec
	patches         *prometheus.CounterVec
	reloads         *prometheus.CounterVec
	reloadLatency   *prometheus.HistogramVec
	queueDepth      prometheus.Gauge

	queue queueMetrics
}

// New makes a registry and registers luaop's metrics, the workqueue metrics, and
// the Go runtime and process collectors in it.
func New() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		handlerRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "luaop_handler_runs_total",
			Help: "Handler attempts, by resource, handler id, reason (create, update, delete, resume, event, daemon, timer...) and outcome (success, retry, failure, ignored).",
		}, []string{"resource", "handler", "reason", "outcome"}),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "luaop_handler_duration_seconds",
			Help:    "How long handler attempts took.",
			Buckets: HandlerDurationBuckets,
		}, []string{"resource", "handler"}),
		luaErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "luaop_lua_errors_total",
			Help: "Handler attempts that failed with a Lua error (a raised error, a runtime error or a timeout; not luaop.temporary_error or luaop.permanent_error).",
		}, []string{"handler"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "luaop_events_received_total",
			Help: "Watch notifications received, by resource and type (ADDED, MODIFIED, DELETED).",
		}, []string{"resource", "type"}),
		patches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "luaop_patches_total",
			Help: "Patches sent to the API server, by resource, subresource (\"status\", or empty for the object) and result.",
		}, []string{"resource", "subresource", "result"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "luaop_reloads_total",
			Help: "Script loads, by result (ok, error).",
		}, []string{"result"}),
		reloadLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "luaop_reload_latency_seconds",
			Help:    "Reloads of the scripts while running, by result (ok, error): from the first file event of a save to the new handlers being active (or the error known).",
			Buckets: ReloadLatencyBuckets,
		}, []string{"result"}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "luaop_queue_depth",
			Help: "Objects waiting in the processing queue (all queues made with WorkqueueProvider).",
		}),
		queue: newQueueMetrics(),
	}
	// Both results exist from the start, so that rate() and alerts see a zero.
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	m.reloadLatency.WithLabelValues("ok")
	m.reloadLatency.WithLabelValues("error")
	m.registry.MustRegister(
		m.handlerRuns, m.handlerDuration, m.luaErrors, m.events, m.patches, m.reloads, m.reloadLatency, m.queueDepth,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.queue.register(m.registry)
	return m
}

// Registry is the registry of these metrics, to add collectors of one's own.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the metrics in the Prometheus exposition formats (mount it at
// /metrics).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// HandlerRun records one finished handler attempt; isLuaError tells whether it
// failed with an error of the Lua code (luabind.ScriptError).
func (m *Metrics) HandlerRun(resource, handler, reason, outcome string, d time.Duration, isLuaError bool) {
	m.handlerRuns.WithLabelValues(resource, handler, reason, outcome).Inc()
	m.handlerDuration.WithLabelValues(resource, handler).Observe(d.Seconds())
	if isLuaError {
		m.luaErrors.WithLabelValues(handler).Inc()
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

// Reload records one load of the scripts (the first one included).
func (m *Metrics) Reload(ok bool) {
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
	} else {
		m.reloads.WithLabelValues("error").Inc()
	}
}

// ReloadLatency records how long one reload while running took, from the first file
// event of the save to the new handlers being active (devloop.ReloadEvent.Latency).
// The initial load, with no save to start from, is not recorded.
func (m *Metrics) ReloadLatency(ok bool, d time.Duration) {
	result := "ok"
	if !ok {
		result = "error"
	}
	m.reloadLatency.WithLabelValues(result).Observe(d.Seconds())
}
