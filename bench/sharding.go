package main

// The sharding scenario (`go run ./bench -scenario sharding`, `make bench-sharding`):
// luaop run --shard-across-replicas with 1, 2 and 3 replicas on the same API server
// (issue 36, item 5). Each run starts its replicas on a fresh namespace (their
// Leases there too), waits until every replica sees all the members, creates N
// objects with a few concurrent clients and waits until the benchmark's watch saw
// every one handled (status.handled). It reports, per replica count:
//   - throughput: N / (last object seen handled - first create sent);
//   - latency: each object's create call returned -> seen handled, p50 and p99;
//   - assignment: create call returned -> the shard label seen on the object (the
//     coordinator's write; issue 36: "within a second of their creation");
//   - RSS of each replica, idle before the objects and idle holding its share, and
//     which replica is the coordinator (it also holds every object's metadata);
//   - handler runs: "RAN create" lines in the replicas' logs, summed (must be N).
// A run of one unsharded replica (luaop run without the flag) gives the
// single-replica path's figures next to them.
//
// Then the slow-handler run: the create handler waits in luaop.sleep(0.2) and each
// replica has --workers=4, so a replica handles at most 20 objects per second and
// the replicas, not the API server, are the bottleneck: 3 replicas should reach
// >= 2.5x one (issue 36).

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
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// shardLabel is the label the coordinator writes (--prefix luaop.dev).
const shardLabel = "luaop.dev/shard"

// shardFastScript: the create handler of the storms, counted in the log.
const shardFastScript = `local luaop = require("luaop")

luaop.on.create("` + benchResource + `", function(ctx)
  ctx.logger.warn("RAN create")
  return true
end, { id = "handled" })
`

// shardSlowScript: the same after luaop.sleep(0.2) (I/O-bound: holds no CPU).
const shardSlowScript = `local luaop = require("luaop")

luaop.on.create("` + benchResource + `", function(ctx)
  luaop.sleep(0.2)
  ctx.logger.warn("RAN create")
  return true
end, { id = "handled" })
`

// trickleObjects are created one at a time after a sharded create storm.
const trickleObjects = 50

// shardRunSpec is one run of the scenario.
type shardRunSpec struct {
	kind     string // "fast" or "slow"
	replicas int
	sharded  bool
	n        int
	workers  int
}

func (s shardRunSpec) tag() string {
	mode := "sharded"
	if !s.sharded {
		mode = "unsharded"
	}
	return fmt.Sprintf("[sharding %s %d %s N=%d]", s.kind, s.replicas, mode, s.n)
}

// replicaResult is what one replica did in a run.
type replicaResult struct {
	idleRSS, rss, hwm int64
	// idleAnon, anon: the anonymous part of the RSS (heap, stacks, the runtime's
	// own); the rest is file-backed (the binary's pages).
	idleAnon, anon int64
	owned          int
	coordinator    bool
	runs           int
}

type shardRunResult struct {
	spec       shardRunSpec
	err        error
	total      time.Duration
	lat, assig []time.Duration // sorted
	// trickle: the assignment latencies of objects created one at a time, 100 ms
	// apart, once the replicas are idle (sharded create storms only); sorted.
	trickle  []time.Duration
	replicas []replicaResult
}

func (r *shardRunResult) rate() float64 {
	if r.err != nil || r.total <= 0 {
		return 0
	}
	return float64(r.spec.n) / r.total.Seconds()
}

// shardState is the part of luaop's /debug the benchmark reads.
type shardState struct {
	Members     []string `json:"members"`
	Owned       int      `json:"owned"`
	Coordinator bool     `json:"coordinator"`
}

func debugShard(port int) (shardState, bool) {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/debug", port))
	if err != nil {
		return shardState{}, false
	}
	defer resp.Body.Close()
	var doc struct {
		Sharding *shardState `json:"sharding"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&doc) != nil || doc.Sharding == nil {
		return shardState{}, false
	}
	return *doc.Sharding, true
}

// procAnon is RssAnon of /proc/<pid>/status, in bytes (0 when unknown).
func procAnon(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// saveHeapProfile writes the replica's heap profile (luaop run --profiles).
func saveHeapProfile(port int, path string) error {
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", port))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/debug/pprof/heap: status %d", resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

type shardingOptions struct {
	luaopBin, kubeconfig, tmp, commit string
	n, slowN                          int
	replicas                          []int
	workers, slowWorkers, creators    int
	timeout                           time.Duration
	profiles                          bool // heap profiles of every replica, in tmp
	leaseDuration                     time.Duration
	// payload: bytes of spec.data in every object of the storm (0: none), to see
	// how memory splits when the objects, not the process's base, dominate it.
	payload int
}

// runSharding runs the scenario and prints its tables; the exit status.
func runSharding(ctx context.Context, cl *cluster, o shardingOptions) int {
	dirs := map[string]string{"fast": filepath.Join(o.tmp, "scripts-shard-fast"), "slow": filepath.Join(o.tmp, "scripts-shard-slow")}
	if err := writeBenchScripts(map[string]string{dirs["fast"]: shardFastScript, dirs["slow"]: shardSlowScript}); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	var specs []shardRunSpec
	if o.n > 0 {
		specs = append(specs, shardRunSpec{kind: "fast", replicas: 1, n: o.n, workers: o.workers})
		for _, r := range o.replicas {
			specs = append(specs, shardRunSpec{kind: "fast", replicas: r, sharded: true, n: o.n, workers: o.workers})
		}
	}
	if o.slowN > 0 {
		for _, r := range o.replicas {
			specs = append(specs, shardRunSpec{kind: "slow", replicas: r, sharded: true, n: o.slowN, workers: o.slowWorkers})
		}
	}
	var results []*shardRunResult
	for _, spec := range specs {
		if ctx.Err() != nil {
			break
		}
		progress("=== %s ===", spec.tag())
		res := shardRun(ctx, cl, o, spec, dirs[spec.kind])
		if res.err != nil {
			progress("%s FAILED: %v", spec.tag(), res.err)
		}
		results = append(results, res)
	}
	printShardTables(o, results)
	for _, r := range results {
		if r.err != nil {
			return 1
		}
	}
	if ctx.Err() != nil {
		return 130
	}
	return 0
}

func shardRun(ctx context.Context, cl *cluster, o shardingOptions, spec shardRunSpec, scripts string) (res *shardRunResult) {
	res = &shardRunResult{spec: spec}
	tag := spec.tag()
	trickle := 0
	if spec.sharded && spec.kind == "fast" {
		trickle = trickleObjects
	}
	ns, tr, cleanup, err := cl.trackedNamespace(ctx, "shard-"+spec.kind, spec.replicas, spec.n+trickle, tag)
	if err != nil {
		res.err = err
		return res
	}
	defer cleanup()
	tr.setPhase(phaseCreate)

	extra := []string{"--metrics-address="} // replicas side by side: no port of their own
	if spec.sharded {
		extra = append(extra, "--shard-across-replicas", "--shard-namespace", ns, "--shard-group", "bench",
			"--shard-lease-duration", o.leaseDuration.String())
	}
	if o.profiles {
		extra = append(extra, "--profiles")
	}
	subj := &luaopSubject{label: "luaop", bin: o.luaopBin, scriptsDir: scripts, kubeconfig: o.kubeconfig, workers: spec.workers, extra: extra}
	var insts []*childInstance
	var ports []int
	defer func() {
		for _, inst := range insts {
			_ = inst.stop()
		}
	}()
	for i := range spec.replicas {
		logPath := filepath.Join(o.tmp, fmt.Sprintf("shard-%s-%d-%v-r%d.log", spec.kind, spec.replicas, spec.sharded, i+1))
		inst, err := subj.launch(ns, 0, logPath)
		if err != nil {
			res.err = err
			return res
		}
		c := inst.(*childInstance)
		insts = append(insts, c)
		ports = append(ports, healthPort(c.c.cmd.Args))
	}
	sctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	for i, inst := range insts {
		if _, err := waitReady(sctx, inst); err != nil {
			res.err = fmt.Errorf("replica %d: %v (log: %s)", i+1, err, inst.logPath())
			return res
		}
	}
	if spec.sharded {
		// Every replica sees every member: the objects are then spread at once.
		for {
			all := true
			for _, p := range ports {
				st, ok := debugShard(p)
				all = all && ok && len(st.Members) == spec.replicas
			}
			if all {
				break
			}
			if !sleep(sctx, 100*time.Millisecond) {
				res.err = fmt.Errorf("the replicas do not see %d members: %w", spec.replicas, sctx.Err())
				return res
			}
		}
	}
	progress("%s %d replica(s) ready (--workers=%d); idle", tag, spec.replicas, spec.workers)
	res.replicas = make([]replicaResult, spec.replicas)
	for i, inst := range insts {
		quiesce(sctx, inst)
		_, res.replicas[i].idleRSS, _ = procStats(inst.pid())
		res.replicas[i].idleAnon = procAnon(inst.pid())
	}

	client := cl.dyn.Resource(benchGVR).Namespace(ns)
	var issued atomic.Int64
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		errc <- forEachObject(sctx, spec.n, o.creators, func(i int) error {
			if err := createObject(sctx, client, i, o.payload); err != nil {
				return err
			}
			tr.issuedAt(i, time.Now())
			issued.Add(1)
			return nil
		})
	}()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	exited := make(chan int, len(insts))
	for i, inst := range insts {
		go func() {
			select {
			case <-inst.exited():
				exited <- i
			case <-sctx.Done():
			}
		}()
	}
wait:
	for {
		seen, _ := tr.counts()
		if seen >= spec.n && issued.Load() >= int64(spec.n) {
			break
		}
		select {
		case err := <-errc:
			if err != nil {
				res.err = err
				return res
			}
			errc = nil
		case i := <-exited:
			res.err = fmt.Errorf("replica %d exited: %v (log: %s)", i+1, insts[i].exitErr(), insts[i].logPath())
			return res
		case <-sctx.Done():
			res.err = fmt.Errorf("%d/%d handled after %s: %w", seen, spec.n, time.Since(start).Round(time.Second), sctx.Err())
			return res
		case <-tick.C:
			progress("%s %s: %d/%d created, %d/%d handled", tag, time.Since(start).Round(time.Second), issued.Load(), spec.n, seen, spec.n)
			continue wait
		case <-time.After(5 * time.Millisecond):
		}
	}
	lat, last := tr.latencies()
	res.total = last.Sub(start)
	slices.Sort(lat)
	res.lat = lat
	if spec.sharded {
		res.assig = tr.assignments(0, spec.n)
		slices.Sort(res.assig)
	}
	progress("%s all %d handled in %s; idle", tag, spec.n, res.total.Round(10*time.Millisecond))
	for i, inst := range insts {
		quiesce(sctx, inst)
		r := &res.replicas[i]
		r.hwm, r.rss, _ = procStats(inst.pid())
		r.anon = procAnon(inst.pid())
		r.runs = inst.runs("create")
		if st, ok := debugShard(ports[i]); ok {
			r.owned, r.coordinator = st.Owned, st.Coordinator
		} else {
			r.owned = -1
		}
		if o.profiles {
			path := filepath.Join(o.tmp, fmt.Sprintf("heap-%s-%d-%v-r%d.pb.gz", spec.kind, spec.replicas, spec.sharded, i+1))
			if err := saveHeapProfile(ports[i], path); err != nil {
				progress("%s heap profile of replica %d: %v", tag, i+1, err)
			} else {
				progress("%s heap profile of replica %d: %s", tag, i+1, path)
			}
		}
	}
	runs := 0
	for _, r := range res.replicas {
		runs += r.runs
	}
	if trickle > 0 {
		// New objects one at a time on idle replicas: how soon each is assigned.
		for i := spec.n; i < spec.n+trickle; i++ {
			if err := createObject(sctx, client, i, o.payload); err != nil {
				res.err = err
				return res
			}
			tr.issuedAt(i, time.Now())
			if !sleep(sctx, 100*time.Millisecond) {
				res.err = sctx.Err()
				return res
			}
		}
		for len(tr.assignments(spec.n, spec.n+trickle)) < trickle {
			if !sleep(sctx, 50*time.Millisecond) {
				res.err = fmt.Errorf("%d of %d new objects assigned: %w", len(tr.assignments(spec.n, spec.n+trickle)), trickle, sctx.Err())
				return res
			}
		}
		res.trickle = tr.assignments(spec.n, spec.n+trickle)
		slices.Sort(res.trickle)
		progress("%s %d objects created one at a time on idle replicas: assigned p50 %s, p99 %s", tag, trickle,
			ms(percentile(res.trickle, 0.5)), ms(percentile(res.trickle, 0.99)))
		// They are handled too before the replicas stop: not counted in the runs.
	}
	if runs != spec.n {
		res.err = fmt.Errorf("%d create handler runs for %d objects (the replicas' logs)", runs, spec.n)
	}
	return res
}

func printShardTables(o shardingOptions, results []*shardRunResult) {
	fmt.Printf("luaop %s; %d CPUs; %s\n\n", o.commit, runtime.NumCPU(), memTotal())
	base := map[string]float64{}
	var oneAll, oneAllAnon int64 // RSS of the one sharded replica holding everything (fast run)
	for _, r := range results {
		if r.spec.sharded && r.spec.replicas == 1 && r.err == nil {
			base[r.spec.kind] = r.rate()
			if r.spec.kind == "fast" {
				oneAll, oneAllAnon = r.replicas[0].rss, r.replicas[0].anon
			}
		}
	}
	for _, kind := range []string{"fast", "slow"} {
		var rows []*shardRunResult
		for _, r := range results {
			if r.spec.kind == kind {
				rows = append(rows, r)
			}
		}
		if len(rows) == 0 {
			continue
		}
		if kind == "fast" {
			fmt.Printf("create storm: N objects created by %d concurrent clients; create handler returns true (status.handled); luaop --workers=%d per replica\n", o.creators, o.workers)
		} else {
			fmt.Printf("slow handlers: the create handler waits in luaop.sleep(0.2) first; luaop --workers=%d per replica (at most %d objects/s per replica)\n", o.slowWorkers, o.slowWorkers*5)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "replicas\tN\tall handled in\tobj/s\tvs 1 replica\tlatency p50 / p99 (create returned -> handled seen)\tassigned p50 / p99 (create returned -> label seen)\tassigned, one at a time, idle\thandler runs\tRSS idle, empty\tRSS idle, holding its share (* coordinator)\tof which anonymous, empty/holding\towned")
		for _, r := range rows {
			name := strconv.Itoa(r.spec.replicas)
			if !r.spec.sharded {
				name += " (unsharded)"
			}
			if r.err != nil {
				fmt.Fprintf(tw, "%s\t%d\tFAILED: %s\n", name, r.spec.n, truncate(r.err.Error(), 120))
				continue
			}
			vs := "-"
			if b := base[kind]; b > 0 && r.spec.sharded {
				vs = fmt.Sprintf("%.2fx", r.rate()/b)
				if kind == "slow" && r.spec.replicas == 3 {
					vs += map[bool]string{true: " (aim >= 2.5x: met)", false: " (aim >= 2.5x: NOT met)"}[r.rate()/b >= 2.5]
				}
			}
			assigned, trickled := "-", "-"
			if r.spec.sharded {
				assigned = ms(percentile(r.assig, 0.5)) + " / " + ms(percentile(r.assig, 0.99))
			}
			if len(r.trickle) > 0 {
				trickled = ms(percentile(r.trickle, 0.5)) + " / " + ms(percentile(r.trickle, 0.99))
			}
			var idle, held, anon, owned []string
			runs := 0
			for _, x := range r.replicas {
				idle = append(idle, mib(x.idleRSS))
				cell := mib(x.rss)
				if x.coordinator {
					cell += "*"
				}
				held = append(held, cell)
				anon = append(anon, fmt.Sprintf("%s/%s", mib(x.idleAnon), mib(x.anon)))
				owned = append(owned, strconv.Itoa(x.owned))
				runs += x.runs
			}
			if !r.spec.sharded {
				owned = []string{"all"}
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.1f\t%s\t%s / %s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", name, r.spec.n, secs(r.total), r.rate(), vs,
				ms(percentile(r.lat, 0.5)), ms(percentile(r.lat, 0.99)), assigned, trickled, runs,
				strings.Join(idle, ", "), strings.Join(held, ", "), strings.Join(anon, ", "), strings.Join(owned, ", "))
		}
		tw.Flush()
		fmt.Println()
	}
	if oneAll <= 0 {
		return
	}
	for _, r := range results {
		if r.spec.kind != "fast" || !r.spec.sharded || r.spec.replicas < 2 || r.err != nil {
			continue
		}
		var largest, largestMember, largestAnon, largestMemberAnon int64
		for _, x := range r.replicas {
			largest, largestAnon = max(largest, x.rss), max(largestAnon, x.anon)
			if !x.coordinator {
				largestMember, largestMemberAnon = max(largestMember, x.rss), max(largestMemberAnon, x.anon)
			}
		}
		line := fmt.Sprintf("RSS with %d replicas / one replica holding all (%s): largest %.2f", r.spec.replicas, mib(oneAll), float64(largest)/float64(oneAll))
		if largestMember > 0 {
			line += fmt.Sprintf(", largest but the coordinator %.2f", float64(largestMember)/float64(oneAll))
		}
		if r.spec.replicas == 3 {
			line += map[bool]string{true: " (aim <= 0.45: met)", false: " (aim <= 0.45: NOT met)"}[float64(largest)/float64(oneAll) <= 0.45]
		}
		if oneAllAnon > 0 {
			line += fmt.Sprintf("; anonymous RSS only (the binary's file-backed pages left out: %s): largest %.2f", mib(oneAllAnon), float64(largestAnon)/float64(oneAllAnon))
			if largestMemberAnon > 0 {
				line += fmt.Sprintf(", largest but the coordinator %.2f", float64(largestMemberAnon)/float64(oneAllAnon))
			}
		}
		fmt.Println(line)
	}
}
