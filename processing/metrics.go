package processing

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/luaop/luaop/processing/causes"
)

// ReconcileObserver is an optional capability of Options.Observer (found by type
// assertion): it is told about every cycle, for controller-runtime's reconcile
// metrics. One cycle of one object is one reconcile, and a resource is a controller.
// Its methods are called from worker goroutines and must return quickly.
type ReconcileObserver interface {
	// ReconcileStarted and ReconcileFinished bracket one cycle of one object of
	// the resource named controller (ControllerName). result is
	// controller-runtime's word: "success", "error" (an error of the framework,
	// such as a failed patch; failed handlers are outcomes, not errors) or
	// "requeue_after" (the object asked to be looked at again after a delay: a
	// retry, a timer).
	ReconcileStarted(controller string)
	ReconcileFinished(controller, result string, d time.Duration)
	// MaxConcurrentReconciles tells, when a resource starts being watched, how
	// many of its objects may be handled at once (Options.Workers).
	MaxConcurrentReconciles(controller string, n int)
}

// PanicObserver is an optional capability of Options.Observer: it is told about
// every panic recovered while processing an object (controller-runtime's
// controller_runtime_reconcile_panics_total).
type PanicObserver interface {
	ReconcilePanicked(controller string)
}

// ControllerName is the name of a resource in metrics and status: its plural and
// group, "widgets.example.com" ("configmaps" for the core group), as
// controller-runtime's controller label and client-go's work queue names go.
func ControllerName(r causes.Resource) string { return r.GroupResource().String() }

// queueMetrics feeds client-go's work queue metrics per resource: the operator has
// one work queue for every resource, so the metrics client-go keeps per queue would
// all be named alike; here every series is named after the resource of the keys
// (ControllerName), as if each resource had a queue of its own, as in
// controller-runtime. The queue's storage (laneFIFO) tells what enters and
// leaves it; the worker tells when it is done with a key and when it adds one back
// after a delay (a retry).
//
// mu is a leaf: it guards the maps; the metrics are called after it is released,
// except from the FIFO, which client-go calls under its own lock (as client-go's own
// metrics are).
type queueMetrics struct {
	provider workqueue.MetricsProvider
	clock    clock.PassiveClock

	mu        sync.Mutex
	resources map[causes.Resource]*resourceQueueMetrics
	added     map[objectKey]time.Time // in the queue since
	started   map[objectKey]time.Time // taken by a worker at
}

type resourceQueueMetrics struct {
	depth                   workqueue.GaugeMetric
	adds, retries           workqueue.CounterMetric
	latency, work           workqueue.HistogramMetric
	unfinished, longestWork workqueue.SettableGaugeMetric
}

func newQueueMetrics(p workqueue.MetricsProvider, clk clock.PassiveClock) *queueMetrics {
	return &queueMetrics{provider: p, clock: clk, resources: map[causes.Resource]*resourceQueueMetrics{},
		added: map[objectKey]time.Time{}, started: map[objectKey]time.Time{}}
}

// of returns the metrics of one resource, made on first use. Called under q.mu.
func (q *queueMetrics) of(r causes.Resource) *resourceQueueMetrics {
	m := q.resources[r]
	if m == nil {
		name := ControllerName(r)
		m = &resourceQueueMetrics{
			depth:       q.provider.NewDepthMetric(name),
			adds:        q.provider.NewAddsMetric(name),
			retries:     q.provider.NewRetriesMetric(name),
			latency:     q.provider.NewLatencyMetric(name),
			work:        q.provider.NewWorkDurationMetric(name),
			unfinished:  q.provider.NewUnfinishedWorkSecondsMetric(name),
			longestWork: q.provider.NewLongestRunningProcessorSecondsMetric(name),
		}
		q.resources[r] = m
	}
	return m
}

// pushed: a key entered the queue (a new add, or an add made while it was being
// processed, once the worker is done).
func (q *queueMetrics) pushed(key objectKey) {
	q.mu.Lock()
	m := q.of(key.resource)
	if _, ok := q.added[key]; !ok {
		q.added[key] = q.clock.Now()
	}
	q.mu.Unlock()
	m.adds.Inc()
	m.depth.Inc()
}

// popped: a worker took a key.
func (q *queueMetrics) popped(key objectKey) {
	now := q.clock.Now()
	q.mu.Lock()
	m := q.of(key.resource)
	since, ok := q.added[key]
	delete(q.added, key)
	q.started[key] = now
	q.mu.Unlock()
	m.depth.Dec()
	if ok {
		m.latency.Observe(now.Sub(since).Seconds())
	}
}

// done: the worker finished with a key.
func (q *queueMetrics) done(key objectKey) {
	now := q.clock.Now()
	q.mu.Lock()
	m := q.of(key.resource)
	since, ok := q.started[key]
	delete(q.started, key)
	q.mu.Unlock()
	if ok {
		m.work.Observe(now.Sub(since).Seconds())
	}
}

// retry: a key is added back after a delay.
func (q *queueMetrics) retry(key objectKey) {
	q.mu.Lock()
	m := q.of(key.resource)
	q.mu.Unlock()
	m.retries.Inc()
}

// updateUnfinished sets, per resource, the seconds of work in progress and of the
// longest running one (client-go updates them every 500ms).
func (q *queueMetrics) updateUnfinished() {
	now := q.clock.Now()
	type sums struct{ total, longest float64 }
	q.mu.Lock()
	per := make(map[*resourceQueueMetrics]sums, len(q.resources))
	for _, m := range q.resources {
		per[m] = sums{}
	}
	for key, since := range q.started {
		m := q.of(key.resource)
		s := per[m]
		d := now.Sub(since).Seconds()
		s.total += d
		s.longest = max(s.longest, d)
		per[m] = s
	}
	q.mu.Unlock()
	for m, s := range per {
		m.unfinished.Set(s.total)
		m.longestWork.Set(s.longest)
	}
}

// runUpdates updates the unfinished-work gauges every 500ms until ctx ends.
func (q *queueMetrics) runUpdates(ctx context.Context, clk clock.WithTicker) {
	t := clk.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			q.updateUnfinished()
		}
	}
}
