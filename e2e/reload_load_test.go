package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/reloading"
	"github.com/luaop/luaop/testcluster"
)

// Reload under load (issue 18): objects are created and updated while a script is
// saved every second. No handler run may be lost or doubled, memos and daemons are
// kept, and no reload stalls the cycles. TestReloadUnderLoad runs it on 500
// objects; BenchmarkReloadUnderLoad (make bench-reload) on 10,000.

// The handlers file, rewritten on every save with a new first line (which moves
// every line below: the code hashes must not change, so no daemon restarts).
const rulHandlers = `local luaop = require("luaop")
local W = "examples.luaop.dev/v1/widgets"
luaop.on.create(W, function(ctx)
  ctx.logger.info("RUN create " .. ctx.name)
  return true
end, {id = "created"})
luaop.on.field(W, "spec.size", function(ctx)
  ctx.memo.runs = (ctx.memo.runs or 0) + 1
  ctx.logger.info("RUN size " .. ctx.name .. " " .. tostring(ctx.new) .. " " .. ctx.memo.runs .. " " .. ctx.reason .. " " .. tostring(ctx.old))
  return {size = ctx.new, runs = ctx.memo.runs}
end, {id = "sized"})
luaop.daemon(W, function(ctx)
  ctx.logger.info("DAEMON up " .. ctx.name)
  while luaop.sleep(60) do end
  ctx.logger.info("DAEMON down " .. ctx.name)
end, {id = "watch", cancellation_timeout = 1})
`

// The other file saved every second: its handler's code really changes (it is
// compiled again and its code hash changes), on a resource with no objects here.
const rulExtra = `local luaop = require("luaop")
luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx) return "REV" end, {id = "extra"})
`

// rulLog collects what the handlers log, per object, from the records themselves.
type rulLog struct {
	mu      sync.Mutex
	creates map[string]int
	sizes   map[string][]rulRun
	up      map[string]int
	down    map[string]int
	errors  []string
}

type rulRun struct {
	size, runs int
	how        string // reason and old value
}

func newRulLog() *rulLog {
	return &rulLog{creates: map[string]int{}, sizes: map[string][]rulRun{}, up: map[string]int{}, down: map[string]int{}}
}

func (l *rulLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *rulLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *rulLog) WithGroup(string) slog.Handler            { return l }
func (l *rulLog) Handle(_ context.Context, r slog.Record) error {
	f := strings.Fields(r.Message)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case len(f) == 3 && f[0] == "RUN" && f[1] == "create":
		l.creates[f[2]]++
	case len(f) == 7 && f[0] == "RUN" && f[1] == "size":
		size, _ := strconv.Atoi(f[3])
		runs, _ := strconv.Atoi(f[4])
		l.sizes[f[2]] = append(l.sizes[f[2]], rulRun{size, runs, f[5] + " old=" + f[6]})
	case len(f) == 3 && f[0] == "DAEMON" && f[1] == "up":
		l.up[f[2]]++
	case len(f) == 3 && f[0] == "DAEMON" && f[1] == "down":
		l.down[f[2]]++
	case r.Level >= slog.LevelWarn:
		if len(l.errors) < 20 {
			var attrs []string
			r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a.String()); return true })
			l.errors = append(l.errors, r.Message+" "+strings.Join(attrs, " "))
		}
	}
	return nil
}

// rulOperator is the operator whose loads are timed into the timeline.
type rulOperator struct {
	*testcluster.RunningOperator
	tl *rulTimeline
}

func (o rulOperator) LoadScripts(ctx context.Context, scripts []luabind.Script) (luabind.LoadReport, error) {
	from := time.Now()
	rep, err := o.RunningOperator.LoadScripts(ctx, scripts)
	o.tl.mu.Lock()
	o.tl.loads = append(o.tl.loads, rulWindow{from, time.Now()})
	o.tl.mu.Unlock()
	return rep, err
}

// rulTimeline records handler-run completions and load windows, to find the pauses
// of the work queue a reload could have caused.
type rulTimeline struct {
	mu    sync.Mutex
	runs  []rulDone // in completion order
	loads []rulWindow
}

type rulDone struct {
	at time.Time
	d  time.Duration
}

type rulWindow struct{ from, to time.Time }

func (w rulWindow) overlaps(from, to time.Time) bool { return from.Before(w.to) && to.After(w.from) }

// rulQueue is the work queue's depth gauge (processing.Options.QueueMetrics): it
// records every stretch during which objects waited in the queue and no worker took
// one, from the queue becoming non-empty or the previous take to the next take.
type rulQueue struct {
	mu     sync.Mutex
	depth  int
	since  time.Time
	pauses []rulWindow
}

func (q *rulQueue) Inc() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.depth == 0 {
		q.since = time.Now()
	}
	q.depth++
}

func (q *rulQueue) Dec() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	q.pauses = append(q.pauses, rulWindow{q.since, now})
	q.depth--
	q.since = now
}

type rulNoop struct{}

func (rulNoop) Inc()            {}
func (rulNoop) Observe(float64) {}
func (rulNoop) Set(float64)     {}

// rulQueueMetrics gives the queue's depth gauge to a rulQueue, and drops the rest.
type rulQueueMetrics struct{ q *rulQueue }

func (m rulQueueMetrics) NewDepthMetric(string) workqueue.GaugeMetric { return m.q }
func (rulQueueMetrics) NewAddsMetric(string) workqueue.CounterMetric  { return rulNoop{} }
func (rulQueueMetrics) NewLatencyMetric(string) workqueue.HistogramMetric {
	return rulNoop{}
}
func (rulQueueMetrics) NewWorkDurationMetric(string) workqueue.HistogramMetric {
	return rulNoop{}
}
func (rulQueueMetrics) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return rulNoop{}
}
func (rulQueueMetrics) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return rulNoop{}
}
func (rulQueueMetrics) NewRetriesMetric(string) workqueue.CounterMetric { return rulNoop{} }

// rulFigures are the results of one run.
type rulFigures struct {
	objects, updates, reloads, failedReloads int
	reloadP50, reloadP99, reloadMax          time.Duration // save -> new handlers active
	loadMax                                  time.Duration // Runtime.Load alone
	// heldMax is the longest a reload held a Lua state (LoadReport.Held): the
	// longest a cycle can have waited because of a reload.
	heldMax time.Duration
	// callMax is the longest Operator.LoadScripts call: the load, then a cycle
	// scheduled for every object (processing's Refresh).
	callMax time.Duration
	// stallRun is the longest handler run overlapping a load (it includes the wait
	// for the Lua state a load holds); pause is the longest time objects waited in
	// the work queue with no worker taking one, among those overlapping a load: the
	// longest pause of the work queue a reload can have caused. pauseOther is the
	// longest pause overlapping no load, for comparison; pauseAny the longest.
	stallRun, pause, pauseOther, pauseAny time.Duration
	handlerRuns                           int
	churn, settle                         time.Duration
}

func (f rulFigures) String() string {
	return fmt.Sprintf("%d objects, %d updates, %d handler runs; %d reloads (%d failed): save -> active p50 %s p99 %s max %s, load max %s, Lua state held max %s, LoadScripts max %s; "+
		"longest handler run overlapping a reload %s; longest work-queue pause overlapping a reload %s (overlapping none: %s); churn %s, settled %s later",
		f.objects, f.updates, f.handlerRuns, f.reloads, f.failedReloads, ms(f.reloadP50), ms(f.reloadP99), ms(f.reloadMax), ms(f.loadMax), ms(f.heldMax), ms(f.callMax),
		ms(f.stallRun), ms(f.pause), ms(f.pauseOther), f.churn.Round(time.Millisecond), f.settle.Round(time.Millisecond))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// runReloadUnderLoad creates n widgets and updates each of them `updates` times
// (spec.size 1 -> 1+updates, in rounds over all objects, 8 clients) while both
// script files are saved every second, waits until every object is handled at its
// final size, checks the guarantees and returns the figures.
//
// With eager, the updates follow the creations at once, so that an object may be
// updated before its creation was handled; see TestReloadUnderLoad.
func runReloadUnderLoad(t testing.TB, n, updates int, saveEvery time.Duration, eager bool) rulFigures {
	ns := env.Namespace(t)
	dir := t.TempDir()
	save := func(name, src string) {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil { // as editors save
			t.Fatal(err)
		}
	}
	rev := 0
	saveAll := func() {
		save("handlers.lua", fmt.Sprintf("-- revision %d\n", rev)+rulHandlers)
		save("extra.lua", strings.ReplaceAll(rulExtra, "REV", fmt.Sprintf("rev %d", rev)))
		rev++
	}
	saveAll()

	logs := newRulLog()
	var tl rulTimeline
	queue := &rulQueue{}
	opts := operator.Options{ScriptsDir: dir, Logger: slog.New(logs)}
	opts.Processing.QueueMetrics = rulQueueMetrics{queue}
	opts.Processing.OnHandlerRun = func(r processing.HandlerRun) {
		now := time.Now()
		tl.mu.Lock()
		if r.Reason != "daemon" { // a daemon's run lasts as long as the daemon
			tl.runs = append(tl.runs, rulDone{now, r.Duration})
		}
		tl.mu.Unlock()
	}
	opts.Processing.ConsistencyTimeout = 5 * time.Second
	op := env.StartOperator(t, ns, opts)
	stopped := false
	defer func() {
		if !stopped {
			_ = op.Stop()
		}
	}()

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var (
		evMu   sync.Mutex
		events []reloading.Event
	)
	reloaded := make(chan struct{})
	reloader := reloading.New(reloading.Options{Dir: dir, Operator: rulOperator{op, &tl}, View: reloadsView(func(ev reloading.Event) {
		evMu.Lock()
		events = append(events, ev)
		evMu.Unlock()
	})})
	if err := reloader.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(reloaded)
		reloader.Run(ctx)
	}()

	// Saves every second until the churn is over and everything settled.
	saving := make(chan struct{})
	savesDone := make(chan struct{})
	go func() {
		defer close(savesDone)
		if saveEvery <= 0 { // a baseline without reloads
			<-saving
			return
		}
		tick := time.NewTicker(saveEvery)
		defer tick.Stop()
		for {
			select {
			case <-saving:
				return
			case <-tick.C:
				saveAll()
			}
		}
	}()

	// The churn: creations, then rounds of updates, 8 clients.
	type item struct{ i, size int }
	work := make(chan item, 64)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var churnErrs []string
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				name := fmt.Sprintf("w%05d", it.i)
				var err error
				if it.size == 1 {
					obj := mustYAML(t, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s}, spec: {size: 1}}", name))
					_, err = env.Dynamic.Resource(widgets).Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{})
				} else {
					_, err = env.Dynamic.Resource(widgets).Namespace(ns).Patch(t.Context(), name, types.MergePatchType,
						[]byte(fmt.Sprintf(`{"spec":{"size":%d}}`, it.size)), metav1.PatchOptions{})
				}
				if err != nil {
					errMu.Lock()
					churnErrs = append(churnErrs, err.Error())
					errMu.Unlock()
				}
			}
		}()
	}
	churnStart := time.Now()
	for i := 0; i < n; i++ {
		work <- item{i, 1}
	}
	if !eager {
		// Updates start once every creation is handled and recorded: an update that
		// reaches an object before its creation is recorded is another matter (see
		// the eager flag), not a reload's.
		testcluster.Eventually(t, 5*time.Minute, func() (bool, string) {
			list, err := env.Dynamic.Resource(widgets).Namespace(ns).List(t.Context(), metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			recorded, sample := 0, ""
			for _, o := range list.Items {
				if sample == "" {
					sample = fmt.Sprintf(" (%s: annotations %v, status %v)", o.GetName(), o.GetAnnotations(), o.Object["status"])
				}
				status, _ := o.Object["status"].(map[string]any)
				if _, ok := diffBaseOf(&o); ok && status["created"] == true {
					recorded++
				}
			}
			return recorded == n, fmt.Sprintf("%d of %d creations handled and recorded%s", recorded, n, sample)
		})
	}
	for size := 2; size <= 1+updates; size++ {
		for i := 0; i < n; i++ {
			work <- item{i, size}
		}
	}
	close(work)
	wg.Wait()
	churnEnd := time.Now()
	if len(churnErrs) > 0 {
		t.Fatalf("%d churn requests failed, first: %s", len(churnErrs), churnErrs[0])
	}

	// Settle: every object handled at its final size.
	final := 1 + updates
	testcluster.Eventually(t, 5*time.Minute, func() (bool, string) {
		list, err := env.Dynamic.Resource(widgets).Namespace(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		pending := 0
		for _, o := range list.Items {
			status, _ := o.Object["status"].(map[string]any)
			sized, _ := status["sized"].(map[string]any)
			if v, ok := sized["size"].(int64); !ok || v != int64(final) {
				pending++
			}
		}
		return len(list.Items) == n && pending == 0, fmt.Sprintf("%d of %d objects, %d not handled at size %d", len(list.Items), n, pending, final)
	})
	settled := time.Now()
	close(saving)
	<-savesDone
	// One more save, to be sure the reloads still work after the churn.
	evMu.Lock()
	before := len(events)
	evMu.Unlock()
	saveAll()
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		evMu.Lock()
		defer evMu.Unlock()
		return len(events) > before && events[len(events)-1].Err == nil && op.Runtime().Hash() == events[len(events)-1].Report.Hash,
			"waiting for the last save's reload"
	})
	cancel()
	<-reloaded

	// Read the results while the operator still runs: no daemon may have stopped.
	list, err := env.Dynamic.Resource(widgets).Namespace(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs.mu.Lock()
	var problems []string
	problem := func(format string, args ...any) {
		if len(problems) < 15 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for _, o := range list.Items {
		name := o.GetName()
		if c := logs.creates[name]; c != 1 {
			problem("%s: create handler ran %d times, want once", name, c)
		}
		if u, d := logs.up[name], logs.down[name]; u != 1 || d != 0 {
			problem("%s: daemon started %d times and stopped %d times, want started once and running", name, u, d)
		}
		runs := logs.sizes[name]
		for k, r := range runs {
			if r.runs != k+1 {
				problem("%s: size run %d saw memo.runs = %d: the memo was lost", name, k+1, r.runs)
				break
			}
			if k > 0 && r.size <= runs[k-1].size {
				problem("%s: size %d handled after size %d: a run doubled or out of order (%v)", name, r.size, runs[k-1].size, runs)
				break
			}
		}
		if len(runs) == 0 || runs[len(runs)-1].size != final {
			problem("%s: the final size %d was not handled (runs %v)", name, final, runs)
		}
		status, _ := o.Object["status"].(map[string]any)
		sized, _ := status["sized"].(map[string]any)
		if got, _ := sized["runs"].(int64); int(got) != len(runs) {
			problem("%s: status.sized.runs = %d but the handler ran %d times", name, got, len(runs))
		}
	}
	handlerErrors := append([]string(nil), logs.errors...)
	logs.mu.Unlock()

	// Stop, then release the finalizers (daemons) so the namespace can go.
	_ = op.Stop()
	stopped = true
	for _, o := range list.Items {
		_, _ = env.Dynamic.Resource(widgets).Namespace(ns).Patch(t.Context(), o.GetName(),
			types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}

	for _, p := range problems {
		t.Error(p)
	}
	for _, e := range handlerErrors {
		t.Logf("operator warning/error: %s", e)
	}

	// Figures.
	fig := rulFigures{objects: n, updates: n * updates, churn: churnEnd.Sub(churnStart), settle: settled.Sub(churnEnd)}
	evMu.Lock()
	var lat []time.Duration
	for _, ev := range events {
		fig.reloads++
		if ev.Err != nil {
			fig.failedReloads++
			t.Errorf("reload failed: %v", ev.Err)
			continue
		}
		lat = append(lat, ev.Latency)
		fig.loadMax = max(fig.loadMax, ev.Report.Took)
		fig.heldMax = max(fig.heldMax, ev.Report.Held)
	}
	evMu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		fig.reloadP50, fig.reloadP99, fig.reloadMax = lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1]
	}
	tl.mu.Lock()
	fig.handlerRuns = len(tl.runs)
	for _, w := range tl.loads {
		fig.callMax = max(fig.callMax, w.to.Sub(w.from))
	}
	for _, r := range tl.runs {
		for _, w := range tl.loads {
			if w.overlaps(r.at.Add(-r.d), r.at) {
				fig.stallRun = max(fig.stallRun, r.d)
			}
		}
	}
	queue.mu.Lock()
	for _, p := range queue.pauses {
		d := p.to.Sub(p.from)
		fig.pauseAny = max(fig.pauseAny, d)
		overlaps := false
		for _, w := range tl.loads {
			overlaps = overlaps || w.overlaps(p.from, p.to)
		}
		if overlaps {
			fig.pause = max(fig.pause, d)
		} else {
			fig.pauseOther = max(fig.pauseOther, d)
		}
	}
	queue.mu.Unlock()
	tl.mu.Unlock()
	return fig
}

// TestReloadUnderLoad: 500 objects created, then updated 3 times each, while both
// script files are saved every second (make bench-reload runs 10,000).
//
// LUAOP_TEST_NO_RELOAD=1 runs the same churn without saves (a baseline).
// LUAOP_TEST_EAGER_UPDATES=1 sends the updates right behind the creations: with
// daemons on the objects, some creations are then handled with a later spec.size and
// the field handler runs a second time for that same size, as an update with a
// stale ctx.old; this happens without any reload too (LUAOP_TEST_NO_RELOAD=1), so
// it is a matter of processing, left to it (issue 18's report).
func TestReloadUnderLoad(t *testing.T) {
	env.Require(t)
	every := time.Second
	if os.Getenv("LUAOP_TEST_NO_RELOAD") != "" {
		every = 0
	}
	n := 500
	if v, err := strconv.Atoi(os.Getenv("LUAOP_TEST_OBJECTS")); err == nil && v > 0 {
		n = v
	}
	fig := runReloadUnderLoad(t, n, 3, every, os.Getenv("LUAOP_TEST_EAGER_UPDATES") != "")
	t.Log(fig)
	if every > 0 && fig.reloads < 3 {
		t.Errorf("only %d reloads happened during the run", fig.reloads)
	}
	// The pauses are figures, not assertions (a shared CPU makes them vary): the
	// benchmark holds them against the goals.
}

// rulCheckStalls (BenchmarkReloadUnderLoad): a reload stalls a cycle by holding the Lua state the cycle needs
// (the load runs the scripts there), at most LoadReport.Held: that must stay under
// 100ms. The work queue also pauses for reasons of its own (all workers waiting on
// the API server, a CPU shared with the control plane, the race detector): on this
// class of machine pauses of 150-300ms happen with and without reloads, so the
// queue's pauses across reloads are reported, and only bounded loosely (a reload that
// blocked the operator would exceed a second).
func rulCheckStalls(t testing.TB, fig rulFigures) {
	if fig.heldMax > 100*time.Millisecond {
		t.Errorf("a reload held a Lua state for %s: cycles of that shard stalled more than 100ms", fig.heldMax)
	}
	if fig.pause > time.Second {
		t.Errorf("the work queue paused %s across a reload", fig.pause)
	}
}

// BenchmarkReloadUnderLoad: 10,000 objects (LUAOP_BENCH_OBJECTS) created, then
// updated twice each, while both script files are saved every second; the same
// checks as TestReloadUnderLoad, and the figures as metrics. One measurement per
// run, whatever b.N. Run: make bench-reload.
func BenchmarkReloadUnderLoad(b *testing.B) {
	env.Require(b)
	n := 10000
	if v, err := strconv.Atoi(os.Getenv("LUAOP_BENCH_OBJECTS")); err == nil && v > 0 {
		n = v
	}
	every := time.Second
	if os.Getenv("LUAOP_TEST_NO_RELOAD") != "" {
		every = 0
	}
	fig := runReloadUnderLoad(b, n, 2, every, false)
	b.Log(fig)
	b.ReportMetric(float64(fig.reloads), "reloads")
	b.ReportMetric(float64(fig.reloadP50.Microseconds())/1000, "reload-p50-ms")
	b.ReportMetric(float64(fig.reloadP99.Microseconds())/1000, "reload-p99-ms")
	b.ReportMetric(float64(fig.heldMax.Microseconds())/1000, "held-max-ms")
	b.ReportMetric(fig.churn.Seconds(), "churn-s")
	b.ReportMetric(float64(fig.stallRun.Microseconds())/1000, "run-overlapping-reload-max-ms")
	b.ReportMetric(float64(fig.pause.Microseconds())/1000, "queue-pause-reload-max-ms")
	b.ReportMetric(float64(fig.pauseOther.Microseconds())/1000, "queue-pause-other-max-ms")
	rulCheckStalls(b, fig)
}
