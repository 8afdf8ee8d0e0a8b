package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
)

// queueMetrics are client-go's workqueue metrics, under the names and labels that
// controller-runtime uses (workqueue_*{name, controller}, both the queue's name;
// workqueue_depth also {priority}, empty: luaop's queue has no priorities), so that
// its dashboards and alerts, which select by controller, work; Kubernetes
// components' dashboards select by name.
type queueMetrics struct {
	depth                   *prometheus.GaugeVec
	adds                    *prometheus.CounterVec
	latency                 *prometheus.HistogramVec
	workDuration            *prometheus.HistogramVec
	unfinished              *prometheus.GaugeVec
	longestRunningProcessor *prometheus.GaugeVec
	retries                 *prometheus.CounterVec
}

func newQueueMetrics() queueMetrics {
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 10)
	return queueMetrics{
		depth: newGaugeVec("workqueue_depth", "Current depth of workqueue", "name", "controller", "priority"),
		adds:  newCounterVec("workqueue_adds_total", "Total number of adds handled by workqueue", "name", "controller"),
		latency: newHistogramVec("workqueue_queue_duration_seconds", "How long in seconds an item stays in workqueue before being requested.",
			buckets, "name", "controller"),
		workDuration: newHistogramVec("workqueue_work_duration_seconds", "How long in seconds processing an item from workqueue takes.",
			buckets, "name", "controller"),
		unfinished: newGaugeVec("workqueue_unfinished_work_seconds",
			"How many seconds of work has done that is in progress and hasn't been observed by work_duration. "+
				"Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
			"name", "controller"),
		longestRunningProcessor: newGaugeVec("workqueue_longest_running_processor_seconds",
			"How many seconds has the longest running processor for workqueue been running.", "name", "controller"),
		retries: newCounterVec("workqueue_retries_total", "Total number of retries handled by workqueue", "name", "controller"),
	}
}

func (q queueMetrics) register(register func(...prometheus.Collector)) {
	register(q.depth, q.adds, q.latency, q.workDuration, q.unfinished, q.longestRunningProcessor, q.retries)
}

// WorkqueueProvider gives the metrics of client-go work queues, to pass as the
// MetricsProvider of a queue's config. The depth of every queue made with it is also
// added into luaop_queue_depth. Unlike workqueue.SetProvider, it changes no global
// state: queues made without it report nothing here.
func (m *Metrics) WorkqueueProvider() workqueue.MetricsProvider { return provider{m} }

type provider struct{ m *Metrics }

func (p provider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return bothGauges{p.m.queue.depth.WithLabelValues(name, name, ""), p.m.queueDepth}
}

func (p provider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.m.queue.adds.WithLabelValues(name, name)
}

func (p provider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.m.queue.latency.WithLabelValues(name, name)
}

func (p provider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.m.queue.workDuration.WithLabelValues(name, name)
}

func (p provider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.queue.unfinished.WithLabelValues(name, name)
}

func (p provider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.queue.longestRunningProcessor.WithLabelValues(name, name)
}

func (p provider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.m.queue.retries.WithLabelValues(name, name)
}

// bothGauges moves the per-queue depth and luaop_queue_depth together.
type bothGauges struct{ queue, total prometheus.Gauge }

func (g bothGauges) Inc() { g.queue.Inc(); g.total.Inc() }
func (g bothGauges) Dec() { g.queue.Dec(); g.total.Dec() }
