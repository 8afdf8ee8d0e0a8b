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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/workqueue"

	"github.com/luaop/luaop/processing/causes"
)

// /debug's snapshot: an object whose handler waits for a retry, with its progress;
// a running daemon; a scheduled timer.
func TestSnapshotShowsProgressDaemonsAndTimers(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("slow", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "not yet", Delay: time.Minute}
	})
	h.addDaemon(causes.Spec{ID: "watch", Resource: widgets}, func(ctx context.Context, call causes.Call) error {
		<-call.Daemon.Stopped.Done()
		return nil
	})
	h.add(causes.Spec{ID: "tick", Kind: causes.KindTimer, Resource: widgets, Interval: time.Hour}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	uid := e.create("w1", nil)
	var s Snapshot
	e.eventually("the handler waiting, the daemon running and the timer scheduled", func() bool {
		s = e.op.Snapshot()
		return len(s.Objects) == 1 && len(s.Objects[0].Handlers) == 1 && s.Objects[0].Handlers[0].State == "waiting" &&
			len(s.Daemons) == 1 && len(s.Timers) == 1
	})
	o := s.Objects[0]
	if o.Resource != "widgets.example.luaop.dev" || o.Kind != "Widget" || o.Namespace != "default" || o.Name != "w1" || o.UID != uid || o.Reason != "create" {
		t.Errorf("object in flight = %+v", o)
	}
	if hp := o.Handlers[0]; hp.ID != "slow" || hp.Retries != 1 || hp.Delayed == nil || !strings.Contains(hp.Message, "not yet") {
		t.Errorf("handler progress = %+v, want slow waiting after 1 retry with its message", hp)
	}
	if d := s.Daemons[0]; d.Handler != "watch" || d.Name != "w1" || d.Resource != "widgets.example.luaop.dev" {
		t.Errorf("daemon = %+v", d)
	}
	if tm := s.Timers[0]; tm.Handler != "tick" || tm.Next == nil || !tm.Next.After(e.clock.Now()) {
		t.Errorf("timer = %+v, want tick with its next run ahead", tm)
	}
	daemons, timers := e.op.EngineCounts()
	if daemons["widgets.example.luaop.dev"] != 1 || timers["widgets.example.luaop.dev"] != 1 {
		t.Errorf("EngineCounts = %v %v", daemons, timers)
	}
	if _, err := json.Marshal(s); err != nil {
		t.Fatal(err)
	}

	e.delete("w1")
	e.eventually("nothing left once the object is gone", func() bool {
		s := e.op.Snapshot()
		return len(s.Objects) == 0 && len(s.Daemons) == 0 && len(s.Timers) == 0
	})
}

// recordingQueueMetrics counts adds per queue name; recordingObserver the cycles.
type recordingQueueMetrics struct {
	mu   sync.Mutex
	adds map[string]int
}

type noopMetric struct{}

func (noopMetric) Inc()            {}
func (noopMetric) Dec()            {}
func (noopMetric) Set(float64)     {}
func (noopMetric) Observe(float64) {}

func (r *recordingQueueMetrics) NewDepthMetric(string) workqueue.GaugeMetric { return noopMetric{} }
func (r *recordingQueueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return namedCounter{r, name}
}
func (r *recordingQueueMetrics) NewLatencyMetric(string) workqueue.HistogramMetric {
	return noopMetric{}
}
func (r *recordingQueueMetrics) NewWorkDurationMetric(string) workqueue.HistogramMetric {
	return noopMetric{}
}
func (r *recordingQueueMetrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noopMetric{}
}
func (r *recordingQueueMetrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noopMetric{}
}
func (r *recordingQueueMetrics) NewRetriesMetric(string) workqueue.CounterMetric { return noopMetric{} }

type namedCounter struct {
	r    *recordingQueueMetrics
	name string
}

func (c namedCounter) Inc() {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if c.r.adds == nil {
		c.r.adds = map[string]int{}
	}
	c.r.adds[c.name]++
}

func (r *recordingQueueMetrics) addsOf(name string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adds[name]
}

type recordingObserver struct {
	mu      sync.Mutex
	results map[string]int // "controller result"
	max     map[string]int
	active  map[string]int
}

func (o *recordingObserver) EventReceived(string, string)     {}
func (o *recordingObserver) PatchSent(string, string, string) {}
func (o *recordingObserver) ReconcileStarted(c string) {
	o.mu.Lock()
	o.active[c]++
	o.mu.Unlock()
}
func (o *recordingObserver) ReconcileFinished(c, result string, _ time.Duration) {
	o.mu.Lock()
	o.active[c]--
	o.results[c+" "+result]++
	o.mu.Unlock()
}
func (o *recordingObserver) MaxConcurrentReconciles(c string, n int) {
	o.mu.Lock()
	o.max[c] = n
	o.mu.Unlock()
}

func (o *recordingObserver) get(m map[string]int, k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return m[k]
}

// The work queue's metrics and the reconcile metrics are named after each resource
// (controller-runtime's controller, client-go's queue name), though one queue
// serves them all.
func TestQueueAndReconcileMetricsArePerResource(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("greet", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{Value: "hi"}, nil
	})
	cms := causes.Resource{GroupVersionResource: configmapsGVR}
	h.add(causes.Spec{ID: "cm", Kind: causes.KindChange, Resource: cms, Reasons: []causes.Reason{causes.Create}}, func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.TemporaryError{Message: "later", Delay: time.Hour}
	})
	qm := &recordingQueueMetrics{}
	obs := &recordingObserver{results: map[string]int{}, max: map[string]int{}, active: map[string]int{}}
	e := startEnv(t, h, Options{QueueMetrics: qm, Observer: obs, Workers: 3})
	e.create("w1", nil)
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "c1", "namespace": "default", "uid": "uid-c1"}}}
	if _, err := e.dyn.Resource(configmapsGVR).Namespace("default").Create(t.Context(), cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const w, c = "widgets.example.luaop.dev", "configmaps"
	e.eventually("both resources' cycles counted under their own names", func() bool {
		return qm.addsOf(w) >= 1 && qm.addsOf(c) >= 1 &&
			obs.get(obs.results, w+" success") >= 1 && obs.get(obs.results, c+" requeue_after") >= 1
	})
	if qm.addsOf("luaop") != 0 || qm.addsOf("") != 0 {
		t.Errorf("a queue-wide name was used: %v", qm.adds)
	}
	if obs.get(obs.max, w) != 3 || obs.get(obs.max, c) != 3 {
		t.Errorf("max concurrent reconciles = %v, want 3 (Workers) for both", obs.max)
	}
	e.eventually("no worker left active", func() bool { return obs.get(obs.active, w) == 0 && obs.get(obs.active, c) == 0 })
}

// JSON logs keep kind, namespace, name and uid apart; successes go at
// SuccessLogLevel.
func TestObjectLogFieldsAndSuccessLevel(t *testing.T) {
	for _, tt := range []struct {
		name    string
		level   slog.Level
		visible bool
	}{{"info by default", 0, true}, {"debug in production", slog.LevelDebug, false}} {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHandlers()
			h.add(changeSpec("greet", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
				call.Logger.Info("from the handler")
				return causes.Result{}, nil
			})
			var mu sync.Mutex
			var buf bytes.Buffer
			log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
			obs := &recordingObserver{results: map[string]int{}, max: map[string]int{}, active: map[string]int{}}
			e := startEnv(t, h, Options{Logger: log, SuccessLogLevel: tt.level, Observer: obs})
			uid := e.create("w1", nil)
			read := func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
			e.eventually("the handler's log line", func() bool { return strings.Contains(read(), "from the handler") })
			// A success is reported (logged) once the write that stores it has landed,
			// which is after the object shows it: the end of the cycle is the point
			// where its line has been written or never will be.
			e.eventually("the handler's cycle finished", func() bool {
				return len(h.callsOf("greet", "w1")) == 1 && obs.get(obs.results, "widgets.example.luaop.dev success") >= 1
			})
			var line map[string]any
			for _, l := range strings.Split(read(), "\n") {
				if strings.Contains(l, "from the handler") {
					if err := json.Unmarshal([]byte(l), &line); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := map[string]any{"kind": "Widget", "namespace": "default", "name": "w1", "uid": uid, "handler": "greet", "reason": "create",
				"resource": "example.luaop.dev/v1/widgets"}
			for k, v := range want {
				if line[k] != v {
					t.Errorf("log field %s = %v, want %v (line %v)", k, line[k], v, line)
				}
			}
			if _, ok := line["object"]; ok {
				t.Errorf("the object is still one field: %v", line)
			}
			if got := strings.Contains(read(), `"msg":"handler succeeded"`); got != tt.visible {
				t.Errorf("handler succeeded logged at info: %v, want %v", got, tt.visible)
			}
		})
	}
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// The lines production shows (retries and failures: successes are at debug there)
// carry the handler and the cause's reason as fields, and durations as milliseconds.
func TestRetryAndFailureLinesCarryTheReason(t *testing.T) {
	h := newFakeHandlers()
	h.add(changeSpec("flaky", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, errors.New("not yet")
	})
	h.add(changeSpec("broken", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		return causes.Result{}, &causes.PermanentError{Message: "never"}
	})
	h.add(changeSpec("fine", causes.Create), nil)
	var mu sync.Mutex
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	e := startEnv(t, h, Options{Logger: log})
	e.create("w1", nil)
	read := func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
	lines := map[string]map[string]any{}
	e.eventually("a retry, a failure and a success logged", func() bool {
		for _, l := range strings.Split(read(), "\n") {
			var line map[string]any
			if json.Unmarshal([]byte(l), &line) == nil && line["handler"] != nil {
				lines[fmt.Sprint(line["msg"], "/", line["handler"])] = line
			}
		}
		return lines["handler will be retried/flaky"] != nil && lines["handler failed for good/broken"] != nil &&
			lines["handler succeeded/fine"] != nil
	})
	for key, line := range lines {
		if line["reason"] != "create" {
			t.Errorf("%s: reason = %v, want create (line %v)", key, line["reason"], line)
		}
	}
	if _, ok := lines["handler succeeded/fine"]["took_ms"].(float64); !ok {
		t.Errorf("success line without took_ms as a number: %v", lines["handler succeeded/fine"])
	}
}
