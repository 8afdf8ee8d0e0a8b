package main

// The sleep scenario (`go run ./bench -scenario sleep`, `make bench-sleep`): I/O-bound
// handlers. N objects whose create handler calls luaop.sleep(1) and then returns a
// table (status.slept); luaop runs with --workers=16. It measures the time until all
// N are handled, which tells how many handler calls wait at once (N/workers seconds
// when a waiting call releases its Lua shard, N/shards seconds when it holds it), and
// meanwhile the latency of /healthz, polled every 50 ms, with an on.probe handler so
// that every probe runs Lua and competes with the handlers for a shard.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// sleepScript: a create handler that waits one second in luaop.sleep (an I/O-bound
// handler: it holds no CPU), then returns a table into status.slept; and a probe.
const sleepScript = `local luaop = require("luaop")

luaop.on.create("` + benchResource + `", function(ctx)
  local woke = luaop.sleep(1)
  return { slept = 1, woke = woke }
end, { id = "slept" })

luaop.on.probe(function(ctx)
  return "ok"
end, { id = "alive" })
`

// probeStats is what the /healthz poller saw over one window.
type probeStats struct {
	mu       sync.Mutex
	lat      []time.Duration
	failures int
	lastErr  string
	kinds    map[string]int // failures by kind
}

func (p *probeStats) add(d time.Duration, failed, kind string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lat = append(p.lat, d)
	if failed != "" {
		p.failures++
		p.lastErr = failed
		if p.kinds == nil {
			p.kinds = map[string]int{}
		}
		p.kinds[kind]++
	}
}

// kindsCell is "3 no answer in 10 s, 2 probe error" (sorted by kind).
func (p *probeStats) kindsCell() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	keys := make([]string, 0, len(p.kinds))
	for k := range p.kinds {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d %s", p.kinds[k], k))
	}
	return strings.Join(parts, ", ")
}

func (p *probeStats) snapshot() (lat []time.Duration, failures int, lastErr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lat = slices.Clone(p.lat)
	slices.Sort(lat)
	return lat, p.failures, p.lastErr
}

// pollHealthz GETs url every interval (the next request starts interval after the
// previous one started, or at once when that one took longer: never two at a time)
// until ctx ends; each answer goes to the stats current() returns. A probe fails when
// it gets no answer within 10 s, a status other than 200, or a body whose "alive"
// entry carries an error (the probe handler failed or timed out in luaop).
func pollHealthz(ctx context.Context, url string, interval time.Duration, current func() *probeStats) {
	hc := &http.Client{Timeout: 10 * time.Second}
	next := time.Now()
	for ctx.Err() == nil {
		if d := time.Until(next); d > 0 {
			if !sleep(ctx, d) {
				return
			}
		}
		next = time.Now().Add(interval)
		start := time.Now()
		failed, kind := "", ""
		resp, err := hc.Get(url)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failed, kind = err.Error(), "no answer in 10 s"
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			var out map[string]any
			switch {
			case resp.StatusCode != http.StatusOK:
				failed, kind = fmt.Sprintf("status %d: %s", resp.StatusCode, truncate(string(body), 100)), fmt.Sprintf("status %d", resp.StatusCode)
			case json.Unmarshal(body, &out) != nil:
				failed, kind = "not JSON: "+truncate(string(body), 100), "not JSON"
			case out["alive"] != "ok":
				failed, kind = "probe result: "+truncate(string(body), 100), "probe error"
			}
		}
		current().add(time.Since(start), failed, kind)
	}
}

// runSleep runs the sleep scenario once and prints its table; the exit status.
func runSleep(ctx context.Context, cl *cluster, luaopBin, kubeconfig, tmp, commit string, n, workers, shards, creators int, timeout time.Duration) int {
	scripts := filepath.Join(tmp, "scripts-sleep")
	if err := writeBenchScripts(map[string]string{scripts: sleepScript}); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	effShards := shards
	if effShards <= 0 {
		effShards = runtime.GOMAXPROCS(0) // luabind's default: one per CPU
	}
	extra := []string{}
	if shards > 0 {
		extra = append(extra, "--shards", strconv.Itoa(shards))
	}
	subj := &luaopSubject{label: "luaop-sleep", bin: luaopBin, scriptsDir: scripts, kubeconfig: kubeconfig, workers: workers, extra: extra}
	tag := fmt.Sprintf("[sleep N=%d]", n)

	ns, tr, cleanup, err := cl.trackedNamespace(ctx, "sleep", n, n, tag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer cleanup()
	progress("%s namespace %s", tag, ns)
	tr.setPhase(phaseSleep)

	logPath := filepath.Join(tmp, "sleep.log")
	inst, err := subj.launch(ns, 0, logPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	defer inst.stop()
	c := inst.(*childInstance)
	port := healthPort(c.c.cmd.Args)
	sctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := waitReady(sctx, inst); err != nil {
		fmt.Fprintf(os.Stderr, "bench: luaop: %v (log: %s)\n", err, logPath)
		return 1
	}
	progress("%s luaop ready (--workers=%d, %d Lua shards%s); polling /healthz every 50 ms", tag, workers, effShards,
		map[bool]string{true: " (--shards)", false: ": its default, one per CPU"}[shards > 0])

	// /healthz: 3 s idle first (the baseline), then during the storm.
	idle, busy := &probeStats{}, &probeStats{}
	var window atomic.Pointer[probeStats]
	window.Store(idle)
	pctx, pcancel := context.WithCancel(ctx)
	var pwg sync.WaitGroup
	pwg.Add(1)
	go func() {
		defer pwg.Done()
		pollHealthz(pctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", port), 50*time.Millisecond, window.Load)
	}()
	stopPolling := func() { pcancel(); pwg.Wait() }
	defer stopPolling()
	sleep(sctx, 3*time.Second)
	window.Store(busy)

	// The storm: N creates by a few concurrent clients, with no client-side limit.
	client := cl.dyn.Resource(benchGVR).Namespace(ns)
	var issued atomic.Int64
	errc := make(chan error, 1)
	creatorsDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(creatorsDone)
		errc <- forEachObject(sctx, n, creators, func(i int) error {
			if err := createObject(sctx, client, i, 0); err != nil {
				return err
			}
			tr.issuedAt(i, time.Now())
			issued.Add(1)
			return nil
		})
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var failure error
wait:
	for {
		seen, _ := tr.counts()
		if seen >= n && issued.Load() >= int64(n) {
			break
		}
		select {
		case err := <-errc:
			if err == nil {
				errc = nil // all created: wait for them to be handled
				continue
			}
			failure = err
			break wait
		case <-inst.exited():
			failure = fmt.Errorf("luaop exited: %v (log: %s)", inst.exitErr(), logPath)
			break wait
		case <-sctx.Done():
			failure = fmt.Errorf("%d/%d handled after %s: %w", seen, n, time.Since(start).Round(time.Second), sctx.Err())
			break wait
		case <-tick.C:
			lat, fails, _ := busy.snapshot()
			progress("%s %s: %d/%d created, %d/%d handled; /healthz so far: %d probes, p50 %s, max %s, %d failed",
				tag, time.Since(start).Round(time.Second), issued.Load(), n, seen, n, len(lat),
				ms(percentile(lat, 0.5)), ms(percentile(lat, 1)), fails)
		case <-time.After(5 * time.Millisecond):
		}
	}
	window.Store(&probeStats{}) // probes after the storm are not counted
	stopPolling()
	<-creatorsDone
	lat, last := tr.latencies()
	total := last.Sub(start)
	slices.Sort(lat)
	seen, _ := tr.counts()
	if failure != nil {
		progress("%s FAILED: %v", tag, failure)
	} else {
		progress("%s all %d handled in %s", tag, n, total.Round(10*time.Millisecond))
	}

	fmt.Printf("luaop %s; %d CPUs; %s\n\n", commit, runtime.NumCPU(), memTotal())
	fmt.Printf("sleep scenario: %d objects, create handler = luaop.sleep(1) then return a table; luaop --workers=%d, %d Lua shards; %d concurrent clients creating\n\n",
		n, workers, effShards, creators)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "N\tworkers\tshards\thandled\tall handled in\tobj/s\tif calls wait in parallel (N/workers x 1s)\tif one call per shard (N/shards x 1s)\tlatency p50 / p99 (create returned -> status seen)")
	allIn := "n/a"
	rateCell := "n/a"
	if failure == nil {
		allIn = secs(total)
		rateCell = fmt.Sprintf("%.1f", float64(n)/total.Seconds())
	}
	fmt.Fprintf(tw, "%d\t%d\t%d\t%d/%d\t%s\t%s\t%.1fs\t%.1fs\t%s / %s\n", n, workers, effShards, seen, n, allIn, rateCell,
		float64((n+workers-1)/workers), float64((n+effShards-1)/effShards), ms(percentile(lat, 0.5)), ms(percentile(lat, 0.99)))
	tw.Flush()
	fmt.Println("\n/healthz (on.probe handler \"alive\" runs Lua on every request), polled every 50 ms, one request at a time; failure = no answer in 10 s, not 200, or the probe reported an error")
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "window\tprobes\tp50\tp99\tmax\tfailures")
	for _, w := range []struct {
		name string
		p    *probeStats
	}{{"idle (3 s before the storm)", idle}, {"during the storm", busy}} {
		l, f, lastErr := w.p.snapshot()
		cell := strconv.Itoa(f)
		if f > 0 {
			cell += " (" + w.p.kindsCell() + "; last: " + truncate(lastErr, 90) + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", w.name, len(l), ms(percentile(l, 0.5)), ms(percentile(l, 0.99)), ms(percentile(l, 1)), cell)
	}
	tw.Flush()
	if failure != nil {
		fmt.Printf("\nFAILED: %v\n", failure)
		return 1
	}
	return 0
}

// healthPort reads the port of --health-address=127.0.0.1:<port> from luaop's argv.
func healthPort(argv []string) int {
	for _, a := range argv {
		const p = "--health-address=127.0.0.1:"
		if len(a) > len(p) && a[:len(p)] == p {
			v, _ := strconv.Atoi(a[len(p):])
			return v
		}
	}
	return 0
}
