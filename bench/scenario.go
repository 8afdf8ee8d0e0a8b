package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

type stormResult struct {
	total   time.Duration // first call -> last result seen
	issue   time.Duration // first call -> last call returned
	rate    float64       // N / total
	p50     time.Duration // call returned -> result seen
	p99     time.Duration
	peakRSS int64         // VmHWM at the end of the storm
	cpu     time.Duration // CPU time of the process during the storm
	runs    int           // handler runs counted in the log (luaop); -1: n/a
	writes  int           // writes of the operator seen by the benchmark's watch
	server  time.Duration // CPU of kube-apiserver + etcd + kube-controller-manager
	self    time.Duration // CPU of the benchmark itself (senders, watch)
	other   time.Duration // CPU of everything else on the machine (kernel, other work)
	busy    float64       // fraction of the machine's CPUs busy
}

type resumeResult struct {
	took    time.Duration // start -> /readyz 200 (luaop) or -> exit with all done (bare)
	quiet   time.Duration // start -> the process's CPU is idle (luaop child only)
	reruns  int           // handler runs in the restarted process (luaop); -1: n/a
	writes  int           // writes seen from start to 3 s after ready/exit
	peakRSS int64
	cpu     time.Duration
}

// drainResult: N objects created with no operator running, then the operator started.
type drainResult struct {
	took    time.Duration // spawn -> the last object seen handled
	rate    float64       // N / took
	p50     time.Duration // spawn -> each object seen handled
	p99     time.Duration
	created time.Duration // how long creating the N objects took (no operator running)
	peakRSS int64         // VmHWM at the end
	cpu     time.Duration // CPU time of the process from spawn to the last object handled
	runs    int           // create handler runs counted in the log (luaop); -1: n/a
}

type runResult struct {
	variant    string
	n          int
	measurable bool
	create     stormResult
	update     stormResult
	resume     resumeResult
	drain      drainResult
	rss0, rssN int64 // VmRSS idle on the empty namespace, then holding N objects (in-process: Go heap+stacks)
	firstPeak  int64 // the first process's peak RSS over its life (VmHWM)
	firstCPU   time.Duration
	logLines   map[string]int // non-RAN warn/error messages of the operator, counted
	requests   string         // in-process: the operator's API requests during the storms
	objBytes   int            // JSON size of one object after both storms (as the watch delivers it)
	rep        int            // repetition number, from 1
	err        error
}

type runOptions struct {
	creators int
	timeout  time.Duration
	tmp      string
	profile  string         // with an in-process subject: CPU profile of the storms
	servers  map[string]int // control plane pids, when known
	rep      int            // repetition number, names the log folder
}

// runVariant runs every scenario for one implementation on a fresh namespace.
func runVariant(ctx context.Context, cl *cluster, subj subject, n int, opt runOptions) (res *runResult) {
	res = &runResult{variant: subj.name(), n: n, measurable: subj.measurable(), logLines: map[string]int{}, rep: opt.rep}
	fail := func(format string, a ...any) *runResult {
		res.err = fmt.Errorf(format, a...)
		progress("[%s N=%d] FAILED: %v", subj.name(), n, res.err)
		return res
	}
	tag := fmt.Sprintf("[%s N=%d]", subj.name(), n)
	ns, err := cl.createNamespace(ctx, subj.name(), n)
	if err != nil {
		return fail("%v", err)
	}
	progress("%s namespace %s", tag, ns)
	// Whatever happened (Ctrl-C included), the namespace goes, with a bound. The
	// operator is stopped by then (deferred later, run earlier).
	defer cleanUp(cl, subj, ns, opt.creators, tag)
	trCtx, trCancel := context.WithCancel(ctx)
	defer trCancel()
	tr, err := cl.startTracker(trCtx, ns, n)
	if err != nil {
		return fail("%v", err)
	}

	logDir := filepath.Join(opt.tmp, fmt.Sprintf("%s-%d-run%d", subj.name(), n, opt.rep))
	_ = os.MkdirAll(logDir, 0o755)
	first, err := subj.launch(ns, 0, filepath.Join(logDir, "first.log"))
	if err != nil {
		return fail("%v", err)
	}
	defer first.stop()
	sctx, cancel := context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	if _, err := waitReady(sctx, first); err != nil {
		return fail("starting: %v (log: %s)", err, first.logPath())
	}
	quiesce(sctx, first)
	if first.pid() != 0 {
		_, res.rss0, _ = procStats(first.pid())
	} else {
		res.rss0 = heapAndStacks()
	}
	progress("%s ready; idle memory on the empty namespace: %s", tag, mib(res.rss0))

	profile := opt.profile
	if profile != "" && subj.name() != "luaop-inprocess" {
		profile += "." + subj.name()
	}
	if opt.profile != "" && !subj.measurable() {
		f, err := os.Create(profile)
		if err != nil {
			return fail("%v", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail("%v", err)
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
		progress("%s CPU profile of the storms -> %s", tag, profile)
	}

	var reqs *requestStats
	if ip, ok := subj.(*inprocSubject); ok {
		reqs = ip.requests
	}
	if reqs != nil {
		reqs.reset()
	}
	sctx, cancel = context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	res.create, err = storm(sctx, cl, tr, first, ns, n, phaseCreate, opt, tag)
	if err != nil {
		return fail("create storm: %v", err)
	}
	sctx, cancel = context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	res.update, err = storm(sctx, cl, tr, first, ns, n, phaseUpdate, opt, tag)
	if err != nil {
		return fail("update storm: %v", err)
	}
	if opt.profile != "" && !subj.measurable() {
		pprof.StopCPUProfile()
	}
	if reqs != nil {
		res.requests = reqs.report()
	}

	if obj, err := cl.dyn.Resource(benchGVR).Namespace(ns).Get(ctx, objectName(0), metav1.GetOptions{}); err == nil {
		if data, err := json.Marshal(obj.Object); err == nil {
			res.objBytes = len(data)
		}
	}

	// Memory: idle, holding N objects.
	sctx, cancel = context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	quiesce(sctx, first)
	if first.pid() != 0 {
		_, res.rssN, _ = procStats(first.pid())
	} else {
		res.rssN = heapAndStacks()
	}
	if opt.profile != "" && !subj.measurable() {
		runtime.GC()
		if f, err := os.Create(profile + ".heap"); err == nil {
			_ = pprof.WriteHeapProfile(f)
			f.Close()
			progress("%s heap profile -> %s", tag, profile+".heap")
		}
	}
	progress("%s idle memory holding %d objects: %s", tag, n, mib(res.rssN))

	// Resume: stop, start again with N handled objects.
	if c, ok := first.(*childInstance); ok {
		if hwm, _, err := procStats(c.pid()); err == nil {
			c.c.hwm.Store(max(hwm, c.c.hwm.Load()))
		}
	}
	if err := first.stop(); err != nil {
		return fail("stopping: %v", err)
	}
	if c, ok := first.(*childInstance); ok {
		res.firstPeak, res.firstCPU = c.c.usage()
	}
	countLogLines(first.logPath(), res.logLines)
	progress("%s stopped; restarting with %d handled objects", tag, n)
	tr.setPhase(phaseResume)
	sctx, cancel = context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	t0 := time.Now()
	second, err := subj.launch(ns, n, filepath.Join(logDir, "second.log"))
	if err != nil {
		return fail("restarting: %v", err)
	}
	defer second.stop()
	if subj.name() == "bare" {
		select {
		case <-second.exited():
			res.resume.took = time.Since(t0)
			if err := second.exitErr(); err != nil {
				return fail("the restarted reference failed: %v (log: %s)", err, second.logPath())
			}
		case <-sctx.Done():
			return fail("the restarted reference did not see %d objects done: %v", n, sctx.Err())
		}
	} else {
		if _, err := waitReady(sctx, second); err != nil {
			return fail("restarting: %v (log: %s)", err, second.logPath())
		}
		res.resume.took = time.Since(t0)
		if second.pid() != 0 {
			res.resume.quiet = quiesce(sctx, second).Sub(t0)
		}
	}
	time.Sleep(3 * time.Second) // anything that would re-run has time to show
	_, res.resume.writes = tr.counts()
	res.resume.reruns = -1
	if r := second.runs("create"); r >= 0 {
		res.resume.reruns = r + second.runs("update")
	}
	if c, ok := second.(*childInstance); ok && second.pid() != 0 {
		if hwm, _, err := procStats(c.pid()); err == nil {
			c.c.hwm.Store(max(hwm, c.c.hwm.Load()))
		}
	}
	if err := second.stop(); err != nil {
		return fail("stopping after the restart: %v", err)
	}
	if c, ok := second.(*childInstance); ok {
		res.resume.peakRSS, res.resume.cpu = c.c.usage()
	}
	countLogLines(second.logPath(), res.logLines)
	progress("%s restart: %s to %s, %d handler re-runs, %d writes", tag, res.resume.took.Round(time.Millisecond),
		map[bool]string{true: "exit with all done", false: "/readyz 200"}[subj.name() == "bare"], max(res.resume.reruns, 0), res.resume.writes)

	res.drain, err = drain(ctx, cl, subj, n, opt, tag, logDir)
	if err != nil {
		return fail("drain: %v", err)
	}
	return res
}

// drain: N objects are created on a fresh namespace with no operator running; once
// all exist, the operator starts, and the benchmark's watch times until every object
// shows status.handled (from just before the spawn, as for resume).
func drain(ctx context.Context, cl *cluster, subj subject, n int, opt runOptions, tag, logDir string) (res drainResult, err error) {
	res.runs = -1
	ns, err := cl.createNamespace(ctx, subj.name()+"-drain", n)
	if err != nil {
		return res, err
	}
	progress("%s drain: namespace %s", tag, ns)
	defer cleanUp(cl, subj, ns, opt.creators, tag+" drain")
	trCtx, trCancel := context.WithCancel(ctx)
	defer trCancel()
	tr, err := cl.startTracker(trCtx, ns, n)
	if err != nil {
		return res, err
	}
	sctx, cancel := context.WithTimeout(ctx, opt.timeout)
	defer cancel()
	t0 := time.Now()
	if err := createObjects(sctx, cl, ns, n, opt.creators); err != nil {
		return res, fmt.Errorf("creating %d objects with no operator running: %w", n, err)
	}
	res.created = time.Since(t0)
	tr.setPhase(phaseCreate) // from here, the first time each object shows status.handled
	progress("%s drain: %d objects waiting (created in %s); starting the operator", tag, n, res.created.Round(time.Millisecond))
	start := time.Now()
	for i := range n {
		tr.issuedAt(i, start)
	}
	inst, err := subj.launch(ns, 0, filepath.Join(logDir, "drain.log"))
	if err != nil {
		return res, err
	}
	defer inst.stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		seen, _ := tr.counts()
		if seen >= n {
			break
		}
		select {
		case <-inst.exited():
			return res, fmt.Errorf("the operator exited: %v (log: %s)", inst.exitErr(), inst.logPath())
		case <-sctx.Done():
			return res, fmt.Errorf("%d/%d handled after %s: %w", seen, n, time.Since(start).Round(time.Second), sctx.Err())
		case <-tick.C:
			progress("%s drain: %d/%d handled", tag, seen, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
	lat, last := tr.latencies()
	res.took = last.Sub(start)
	res.rate = float64(n) / res.took.Seconds()
	slices.Sort(lat)
	res.p50, res.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	if inst.pid() != 0 {
		res.peakRSS, _, _ = procStats(inst.pid())
		res.cpu, _ = procCPU(inst.pid())
	}
	quiesce(sctx, inst) // the create handlers' trailing writes, and no second run
	if r := inst.runs("create"); r >= 0 {
		res.runs = r
	}
	if err := inst.stop(); err != nil {
		return res, fmt.Errorf("stopping: %v", err)
	}
	progress("%s drain: %d objects in %s (%.0f obj/s), p50 %s, p99 %s from the start", tag, n, res.took.Round(time.Millisecond), res.rate,
		res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond))
	return res, nil
}

// cleanUp deletes a run's namespace (after releasing the subject's finalizers), with
// a bound of its own.
func cleanUp(cl *cluster, subj subject, ns string, creators int, tag string) {
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if subj.finalizers() {
		if err := cl.releaseFinalizers(dctx, ns, creators); err != nil {
			progress("%s cleanup: releasing the finalizers: %v", tag, err)
		}
	}
	if err := cl.deleteNamespace(dctx, ns); err != nil {
		progress("%s cleanup: %v", tag, err)
	}
}

// createObjects creates objects 0..n-1 on ns with a few concurrent clients.
func createObjects(ctx context.Context, cl *cluster, ns string, n, creators int) error {
	client := cl.dyn.Resource(benchGVR).Namespace(ns)
	return forEachObject(ctx, n, creators, func(i int) error { return createObject(ctx, client, i, 0) })
}

// createObject creates object i (with payload bytes of spec.data: 0 for none),
// retrying transport errors; one that an earlier attempt created counts as created.
func createObject(ctx context.Context, client dynamic.ResourceInterface, i, payload int) error {
	obj := newObject(i)
	if payload > 0 {
		_ = unstructured.SetNestedField(obj.Object, strings.Repeat("x", payload), "spec", "data")
	}
	return retry(ctx, func() error {
		_, err := client.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // an earlier attempt went through
		}
		return err
	})
}

// forEachObject runs fn for 0..n-1 with workers concurrent goroutines, and returns
// the first error (naming the object), or ctx's.
func forEachObject(ctx context.Context, n, workers int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s: %w", objectName(i), err)
					}
					errMu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// waitReady polls until the instance is ready; it fails when it exits first.
func waitReady(ctx context.Context, i instance) (time.Duration, error) {
	start := time.Now()
	for {
		if i.ready() {
			return time.Since(start), nil
		}
		select {
		case <-i.exited():
			return 0, fmt.Errorf("exited before being ready: %v", i.exitErr())
		case <-ctx.Done():
			return 0, fmt.Errorf("not ready: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// quiesce waits until the process is idle: at most 10 ms of CPU (one clock tick)
// over the last 500 ms, sampled every 100 ms, for at most 30 s; then 2 s more. It
// returns when the idle window began. In-process, it only waits past the consistency
// timeout's delayed requeues.
func quiesce(ctx context.Context, i instance) time.Time {
	if i.pid() == 0 {
		sleep(ctx, 6*time.Second)
		return time.Now()
	}
	type sample struct {
		at  time.Time
		cpu time.Duration
	}
	var samples []sample
	idleSince := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c, err := procCPU(i.pid())
		if err != nil {
			break
		}
		now := time.Now()
		samples = append(samples, sample{now, c})
		if len(samples) > 5 {
			old := samples[len(samples)-6]
			if c-old.cpu <= 10*time.Millisecond {
				idleSince = old.at
				break
			}
		}
		idleSince = now
		if !sleep(ctx, 100*time.Millisecond) {
			return idleSince
		}
	}
	sleep(ctx, 2*time.Second)
	return idleSince
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// storm creates (or updates) the N objects with a few concurrent clients and waits
// until the benchmark's watch saw the result on every one.
func storm(ctx context.Context, cl *cluster, tr *tracker, inst instance, ns string, n int, kind phase, opt runOptions, tag string) (stormResult, error) {
	creators := opt.creators
	label := map[phase]string{phaseCreate: "create storm", phaseUpdate: "update storm"}[kind]
	res := stormResult{runs: -1}
	tr.setPhase(kind)
	var cpu0 time.Duration
	if inst.pid() != 0 {
		cpu0, _ = procCPU(inst.pid())
	}
	runs0 := inst.runs(map[phase]string{phaseCreate: "create", phaseUpdate: "update"}[kind])
	client := cl.dyn.Resource(benchGVR).Namespace(ns)
	var next, issued atomic.Int64
	var lastIssued atomic.Int64
	errc := make(chan error, creators)
	m0 := sampleMachine(opt.servers)
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	parent := ctx
	ctx, stopSenders := context.WithCancel(ctx)
	defer stopSenders() // runs before wg.Wait
	for range creators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				err := retry(ctx, func() error {
					if kind == phaseCreate {
						_, err := client.Create(ctx, newObject(i), metav1.CreateOptions{})
						if apierrors.IsAlreadyExists(err) {
							return nil // an earlier attempt went through
						}
						return err
					}
					_, err := client.Patch(ctx, objectName(i), types.MergePatchType, []byte(`{"spec":{"n":1}}`), metav1.PatchOptions{})
					return err
				})
				if err != nil {
					errc <- fmt.Errorf("%s: %w", objectName(i), err)
					return
				}
				now := time.Now()
				tr.issuedAt(i, now)
				issued.Add(1)
				lastIssued.Store(now.UnixNano())
			}
		}()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		seen, _ := tr.counts()
		if seen >= n && issued.Load() >= int64(n) {
			break
		}
		select {
		case err := <-errc:
			return res, err
		case <-inst.exited():
			return res, fmt.Errorf("the operator exited: %v (log: %s)", inst.exitErr(), inst.logPath())
		case <-parent.Done():
			return res, fmt.Errorf("%d/%d done after %s: %w", seen, n, time.Since(start).Round(time.Second), parent.Err())
		case <-tick.C:
			progress("%s %s: %d/%d sent, %d/%d handled", tag, label, issued.Load(), n, seen, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
	var busyTime time.Duration
	res.server, res.self, busyTime, res.busy = sampleMachine(opt.servers).since(m0)
	lat, last := tr.latencies()
	res.total = last.Sub(start)
	res.issue = time.Unix(0, lastIssued.Load()).Sub(start)
	res.rate = float64(n) / res.total.Seconds()
	slices.Sort(lat)
	res.p50, res.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	if inst.pid() != 0 {
		res.peakRSS, _, _ = procStats(inst.pid())
		cpu1, _ := procCPU(inst.pid())
		res.cpu = cpu1 - cpu0
	}
	res.other = busyTime - res.server - res.self - res.cpu
	// The operator's trailing work (luaop's diff-base patch comes after the status
	// one) is counted once it is idle again; the next scenario starts from idle too.
	quiesce(parent, inst)
	_, res.writes = tr.counts()
	if kind == phaseUpdate {
		res.writes -= n // the benchmark's own spec patches
	}
	if runs0 >= 0 {
		res.runs = inst.runs(map[phase]string{phaseCreate: "create", phaseUpdate: "update"}[kind]) - runs0
	}
	progress("%s %s: %d objects in %s (%.0f obj/s; sends took %s), p50 %s, p99 %s",
		tag, label, n, res.total.Round(time.Millisecond), res.rate, res.issue.Round(time.Millisecond),
		res.p50.Round(time.Millisecond), res.p99.Round(time.Millisecond))
	return res, nil
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func newObject(i int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bench.luaop.dev/v1",
		"kind":       "BenchObject",
		"metadata":   map[string]any{"name": objectName(i)},
		"spec":       map[string]any{"n": int64(0)},
	}}
}

// retry retries what the API server may answer under load (throttling, timeouts).
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		err = f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !(apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err) || isTransport(err)) {
			return err
		}
		sleep(ctx, time.Duration(attempt+1)*100*time.Millisecond)
	}
	return err
}

func isTransport(err error) bool {
	var se apierrors.APIStatus
	return !errors.As(err, &se) // no API status: the request did not get an answer
}

// countLogLines tallies the operator's own warnings and errors (not the RAN lines).
func countLogLines(path string, into map[string]int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.Contains(line, "RAN ") {
			continue
		}
		msg := line
		if i := strings.Index(line, `"msg":"`); i >= 0 {
			msg = line[i+7:]
			if j := strings.Index(msg, `"`); j >= 0 {
				msg = msg[:j]
			}
		}
		into[truncate(msg, 120)]++
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func mib(b int64) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// warmUp creates, updates and deletes a batch of objects with no operator running, so
// that the first measured run does not pay for the API server's and etcd's warm-up
// (the CRD's storage, caches, connections) and the runs start from similar states.
func warmUp(ctx context.Context, cl *cluster, n, creators int) error {
	ns, err := cl.createNamespace(ctx, "warmup", n)
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		_ = cl.deleteNamespace(dctx, ns)
	}()
	client := cl.dyn.Resource(benchGVR).Namespace(ns)
	start := time.Now()
	if err := forEachObject(ctx, n, creators, func(i int) error {
		if err := createObject(ctx, client, i, 0); err != nil {
			return err
		}
		return retry(ctx, func() error {
			_, err := client.Patch(ctx, objectName(i), types.MergePatchType, []byte(`{"spec":{"n":1}}`), metav1.PatchOptions{})
			return err
		})
	}); err != nil {
		return err
	}
	progress("warm-up: %d objects created and updated in %s (no operator running)", n, time.Since(start).Round(time.Millisecond))
	return ctx.Err()
}

// heapAndStacks is the in-process memory after a full collection: the Go heap in use
// and the goroutine stacks (daemons hold one each).
func heapAndStacks() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse + m.StackInuse)
}
