package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func main() { os.Exit(realMain()) }

func realMain() int {
	nFlag := flag.String("n", "1000", "object counts, comma-separated (e.g. 200 for a quick run, or 1000,10000)")
	workers := flag.Int("workers", 16, "workers of luaop (--workers) and of the reference")
	creators := flag.Int("creators", 8, "concurrent clients creating and updating the objects")
	timeout := flag.Duration("timeout", 5*time.Minute, "bound of each scenario")
	variants := flag.String("variants", "bare,luaop,luaop-status,luaop-daemon", "what to run: bare (the reference), luaop (the binary, default settings), luaop-status (--progress-storage=status --diffbase-storage=status: one /status patch per cycle), luaop-daemon (luaop plus a sleeping daemon per object)")
	profile := flag.String("inprocess-profile", "", "run luaop (and luaop-daemon) in-process instead of as a child: CPU profile of the storms to FILE, heap profile to FILE.heap (FILE.luaop-daemon-inprocess[.heap] for the daemon variant); memory is then the Go heap+stacks after GC, the benchmark's own watch cache included, instead of RSS")
	repeat := flag.Int("repeat", 0, "runs of every implementation per N, alternating their order; the table shows medians (0: 3 for N <= 1000, 1 above)")
	keep := flag.Bool("keep", false, "keep the temporary folder (binaries, scripts, logs) and print its path")
	scenario := flag.String("scenario", "storms", "storms (the side-by-side comparison above), sleep (I/O-bound handlers: N objects (default 200) whose create handler sleeps 1 s, luaop alone, time to handle all and /healthz latency meanwhile) or sharding (luaop run --shard-across-replicas with 1, 2 and 3 replicas: N objects (default 10000), then -slow-n objects with a slow handler); see BENCHMARKS.md")
	shards := flag.Int("shards", 0, "-scenario sleep: luaop's --shards (0: luaop's default, one per CPU)")
	replicasFlag := flag.String("replicas", "1,2,3", "-scenario sharding: replica counts, comma-separated")
	slowN := flag.Int("slow-n", 600, "-scenario sharding: objects of the slow-handler run (luaop.sleep(0.2) in the create handler); 0 skips it")
	slowWorkers := flag.Int("slow-workers", 4, "-scenario sharding: --workers of each replica in the slow-handler run")
	payload := flag.Int("payload", 0, "-scenario sharding: bytes of spec.data in every object of the create storm (0: none); objects of a realistic size show how memory splits when they, not each process's base, dominate it")
	shardLease := flag.Duration("shard-lease-duration", 15*time.Second, "-scenario sharding: the replicas' --shard-lease-duration (luaop's default 15s; a replica that cannot renew within two thirds of it exits, as it must: on an overloaded shared API server give more)")
	heapProfiles := flag.Bool("heap-profiles", false, "-scenario sharding: run the replicas with --profiles and save each one's heap profile, holding its share, in the temporary folder (with -keep)")
	flag.Parse()
	if *scenario != "storms" && *scenario != "sleep" && *scenario != "sharding" {
		fmt.Fprintf(os.Stderr, "bench: -scenario %q: storms, sleep or sharding\n", *scenario)
		return 2
	}
	sleepMode := *scenario == "sleep"
	shardingMode := *scenario == "sharding"
	if sleepMode || shardingMode {
		nSet := false
		flag.Visit(func(f *flag.Flag) { nSet = nSet || f.Name == "n" })
		if !nSet {
			*nFlag = map[bool]string{true: "200", false: "10000"}[sleepMode]
		}
	}
	var replicaCounts []int
	for _, s := range strings.Split(*replicasFlag, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v <= 0 {
			fmt.Fprintf(os.Stderr, "bench: -replicas %q: give positive counts separated by commas\n", *replicasFlag)
			return 2
		}
		replicaCounts = append(replicaCounts, v)
	}

	if *profile != "" {
		// One allocation sample per 8 KiB from here on (the default is one per
		// 512 KiB): the heap profile then attributes bytes per object closely.
		runtime.MemProfileRate = 8192
	}
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		fmt.Fprintln(os.Stderr, `bench: LUAOP_TEST_KUBECONFIG is not set: the benchmark needs a cluster made for it.
Run it with a dedicated local control plane, started and stopped around it:

    make bench                          # N = 1000
    make bench BENCH_FLAGS='-n 200'     # a quick run
    make bench BENCH_FLAGS='-n 1000,10000'

or against a cluster of your own:

    LUAOP_TEST_KUBECONFIG=/path/to/kubeconfig go run ./bench -n 1000`)
		return 2
	}
	var ns []int
	for _, s := range strings.Split(*nFlag, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 0 || v == 0 && !shardingMode { // -scenario sharding -n 0: the slow run alone
			fmt.Fprintf(os.Stderr, "bench: -n %q: give positive counts separated by commas\n", *nFlag)
			return 2
		}
		ns = append(ns, v)
	}
	want := map[string]bool{}
	for _, v := range strings.Split(*variants, ",") {
		v = strings.TrimSpace(v)
		if v != "bare" && v != "luaop" && v != "luaop-status" && v != "luaop-daemon" {
			fmt.Fprintf(os.Stderr, "bench: -variants: unknown %q (bare, luaop, luaop-status, luaop-daemon)\n", v)
			return 2
		}
		want[v] = true
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigc
		progress("interrupted: stopping the children and deleting the namespaces (again to abort at once)")
		cancel()
		<-sigc
		progress("aborted: namespaces bench-* may be left behind")
		os.Exit(130) // the children get SIGKILL from the kernel (Pdeathsig)
	}()
	defer killAllChildren()

	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "luaop-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if *keep {
		defer progress("kept %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	luaopBin, bareBin := filepath.Join(tmp, "luaop"), filepath.Join(tmp, "bare")
	builds := [][2]string{{luaopBin, "./cmd/luaop"}, {bareBin, "./bench/bare"}}
	if sleepMode || shardingMode {
		builds = builds[:1]
	}
	for _, b := range builds {
		progress("building %s", b[1])
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b[0], b[1])
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: building %s: %v\n", b[1], err)
			return 1
		}
	}
	scripts, daemonScripts := filepath.Join(tmp, "scripts"), filepath.Join(tmp, "scripts-daemon")
	if err := writeBenchScripts(map[string]string{scripts: benchScript, daemonScripts: daemonScript}); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	commit := gitDescribe(root)
	progress("luaop at %s", commit)

	cl, err := connect(kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	if err := cl.installCRD(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}

	if sleepMode {
		if len(ns) != 1 {
			fmt.Fprintln(os.Stderr, "bench: -scenario sleep takes one count (-n 200)")
			return 2
		}
		if err := warmUp(ctx, cl, 100, *creators); err != nil {
			fmt.Fprintln(os.Stderr, "bench: warm-up:", err)
			return 1
		}
		code := runSleep(ctx, cl, luaopBin, kubeconfig, tmp, commit, ns[0], *workers, *shards, *creators, *timeout)
		if ctx.Err() != nil {
			return 130
		}
		return code
	}

	if shardingMode {
		if len(ns) != 1 {
			fmt.Fprintln(os.Stderr, "bench: -scenario sharding takes one count (-n 3000)")
			return 2
		}
		if err := warmUp(ctx, cl, 500, *creators); err != nil {
			fmt.Fprintln(os.Stderr, "bench: warm-up:", err)
			return 1
		}
		return runSharding(ctx, cl, shardingOptions{luaopBin: luaopBin, kubeconfig: kubeconfig, tmp: tmp, commit: commit,
			n: ns[0], slowN: *slowN, replicas: replicaCounts, workers: *workers, slowWorkers: *slowWorkers, creators: *creators,
			timeout: *timeout, profiles: *heapProfiles, leaseDuration: *shardLease, payload: *payload})
	}

	if err := warmUp(ctx, cl, 500, *creators); err != nil {
		fmt.Fprintln(os.Stderr, "bench: warm-up:", err)
		return 1
	}

	var subjects []subject
	if want["bare"] {
		subjects = append(subjects, &bareSubject{bin: bareBin, kubeconfig: kubeconfig, workers: *workers})
	}
	if want["luaop"] {
		if *profile != "" {
			subjects = append(subjects, &inprocSubject{label: "luaop-inprocess", scriptsDir: scripts, kubeconfig: kubeconfig, workers: *workers, requests: newRequestStats()})
		} else {
			subjects = append(subjects, &luaopSubject{label: "luaop", bin: luaopBin, scriptsDir: scripts, kubeconfig: kubeconfig, workers: *workers})
		}
	}
	if want["luaop-status"] {
		subjects = append(subjects, &luaopSubject{label: "luaop-status", bin: luaopBin, scriptsDir: scripts, kubeconfig: kubeconfig,
			workers: *workers, extra: []string{"--progress-storage=status", "--diffbase-storage=status"}})
	}
	if want["luaop-daemon"] {
		if *profile != "" {
			subjects = append(subjects, &inprocSubject{label: "luaop-daemon-inprocess", scriptsDir: daemonScripts, kubeconfig: kubeconfig,
				workers: *workers, requests: newRequestStats(), daemons: true})
		} else {
			subjects = append(subjects, &luaopSubject{label: "luaop-daemon", bin: luaopBin, scriptsDir: daemonScripts, kubeconfig: kubeconfig,
				workers: *workers, daemons: true})
		}
	}

	opt := runOptions{creators: *creators, timeout: *timeout, tmp: tmp, profile: *profile, servers: serverPIDs(kubeconfig)}
	var results []*runResult
	started := time.Now()
	for _, n := range ns {
		reps := *repeat
		if reps <= 0 {
			reps = 3
			if n > 1000 {
				reps = 1
			}
		}
		for rep := 1; rep <= reps; rep++ {
			order := append([]subject(nil), subjects...)
			if rep%2 == 0 {
				slices.Reverse(order) // drift of the cluster over time hits both sides
			}
			for _, s := range order {
				if ctx.Err() != nil {
					break
				}
				progress("=== %s, N=%d, run %d/%d ===", s.name(), n, rep, reps)
				o := opt
				o.rep = rep
				results = append(results, runVariant(ctx, cl, s, n, o))
			}
		}
	}
	progress("done in %s", time.Since(started).Round(time.Second))

	fmt.Printf("luaop %s; %d CPUs; %s\n", commit, runtime.NumCPU(), memTotal())
	printTable(os.Stdout, results, ns, *workers, *creators)
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

func repoRoot() (string, error) {
	dir, _ := os.Getwd()
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/luaop/luaop\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run the benchmark from the luaop repository (go run ./bench)")
		}
		dir = parent
	}
}

// --- the report ---------------------------------------------------------------------

func printTable(w *os.File, results []*runResult, ns []int, workers, creators int) {
	fmt.Fprintf(w, "\nluaop vs bare client-go: %d workers each, %d concurrent clients sending; medians of the runs of each N (all runs under details);\naims: ratio >= 0.9 at N=1000, < 7 KB/object beyond the reference, 0 re-runs (the worst run counts);\nlatency: storms (live) = the object's create/patch call returned -> its result seen by the watch; drain = the operator's spawn -> the object seen handled;\ndrain = N objects created with no operator running, then the operator started: obj/s (time from the spawn to the last one handled)\n\n",
		workers, creators)
	all := results
	results = aggregate(results)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tN\tbare obj/s\tluaop obj/s\tratio\tlatency p50 bare / luaop\tlatency p99 bare / luaop\tpeak RSS bare\tpeak RSS luaop\tre-runs")
	for _, n := range ns {
		bare := find(results, "bare", n)
		for _, r := range results {
			if r.n != n || r.variant == "bare" {
				continue
			}
			suffix := ""
			if r.variant != "luaop" {
				suffix = " [" + r.variant + "]"
			}
			if r.err != nil {
				fmt.Fprintf(tw, "all%s\t%d\t\t\t\t\t\t\t\tFAILED: %s\n", suffix, n, truncate(r.err.Error(), 100))
				continue
			}
			for _, row := range []struct {
				name string
				b, l func(*runResult) stormResult
			}{
				{"create storm", func(x *runResult) stormResult { return x.create }, func(x *runResult) stormResult { return x.create }},
				{"update storm", func(x *runResult) stormResult { return x.update }, func(x *runResult) stormResult { return x.update }},
			} {
				l := row.l(r)
				var b stormResult
				if ok(bare) {
					b = row.b(bare)
				}
				fmt.Fprintf(tw, "%s%s\t%d\t%s\t%.0f\t%s\t%s / %s\t%s / %s\t%s\t%s\t%s\n",
					row.name, suffix, n, rate(b.rate), l.rate, ratio(b.rate, l.rate, n),
					ms(b.p50), ms(l.p50), ms(b.p99), ms(l.p99), mib(b.peakRSS), mib(l.peakRSS), reruns(l.runs-n, l.runs >= 0))
			}
			// resume: objects confirmed per second at start-up, with the time.
			var br resumeResult
			if ok(bare) {
				br = bare.resume
			}
			fmt.Fprintf(tw, "resume%s\t%d\t%s\t%s\t%s\t\t\t%s\t%s\t%s\n", suffix, n,
				resumeCell(n, br.took), resumeCell(n, r.resume.took), ratio(perSec(n, br.took), perSec(n, r.resume.took), 0),
				mib(br.peakRSS), mib(r.resume.peakRSS), reruns(r.resume.reruns, r.resume.reruns >= 0))
			// drain: N objects waiting, then the operator starts; obj/s (time to all
			// handled), latency from the spawn to each object handled.
			var bd drainResult
			if ok(bare) {
				bd = bare.drain
			}
			fmt.Fprintf(tw, "drain%s\t%d\t%s\t%s\t%s\t%s / %s\t%s / %s\t%s\t%s\t%s\n", suffix, n,
				resumeCell(n, bd.took), resumeCell(n, r.drain.took), ratio(bd.rate, r.drain.rate, 0),
				ms(bd.p50), ms(r.drain.p50), ms(bd.p99), ms(r.drain.p99), mib(bd.peakRSS), mib(r.drain.peakRSS),
				reruns(r.drain.runs-n, r.drain.runs >= 0))
			// memory: bytes per object idle.
			if r.measurable || r.rssN > 0 {
				bb, lb := perObject(bare), perObject(r)
				beyond := "n/a"
				if !r.measurable {
					bb = 0
					beyond = "in-process: Go heap+stacks after GC, the benchmark's own watch cache included"
				} else if ok(bare) {
					aim := "aim < 7 KB: met"
					if lb-bb >= 7*1024 {
						aim = "aim < 7 KB: NOT met"
					}
					beyond = fmt.Sprintf("%+.1f KB/obj (%s)", (lb-bb)/1024, aim)
				}
				if plain := find(results, strings.Replace(r.variant, "-daemon", "", 1), n); strings.Contains(r.variant, "-daemon") && ok(plain) {
					beyond += fmt.Sprintf("; %+.1f KB/daemon vs luaop", (lb-perObject(plain))/1024)
				}
				fmt.Fprintf(tw, "memory%s\t%d\t%s\t%.1f KB/obj\t%s\t\t\t%s idle\t%s idle\t\n", suffix, n, kbPerObj(bb), lb/1024, beyond,
					mib(rssN(bare)), mib(r.rssN))
			}
		}
		if bare != nil && bare.err != nil {
			fmt.Fprintf(tw, "reference\t%d\t\t\t\t\t\t\t\tFAILED: %s\n", n, truncate(bare.err.Error(), 100))
		}
	}
	tw.Flush()

	// CPU per object: what a saturated machine pays, robust to other work running
	// beside the benchmark (which wall-clock rates are not).
	fmt.Fprintln(w, "\nCPU per object (kube-apiserver+etcd+kube-controller-manager + the operator process, during the storm; medians):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tN\tbare ms/obj (server + operator)\tluaop ms/obj (server + operator)\tbare/luaop (the rate ratio a CPU-bound machine would give)")
	for _, n := range ns {
		bare := find(results, "bare", n)
		for _, r := range results {
			if r.n != n || r.variant == "bare" || !ok(r) || !r.measurable {
				continue
			}
			suffix := ""
			if r.variant != "luaop" {
				suffix = " [" + r.variant + "]"
			}
			for _, row := range []struct {
				name string
				f    func(*runResult) stormResult
			}{{"create storm", func(x *runResult) stormResult { return x.create }}, {"update storm", func(x *runResult) stormResult { return x.update }}} {
				l := row.f(r)
				lc := perObjMS(l.server+l.cpu, n)
				bc, cell, rr := 0.0, "n/a", "n/a"
				if ok(bare) {
					b := row.f(bare)
					bc = perObjMS(b.server+b.cpu, n)
					cell = fmt.Sprintf("%.2f (%.2f + %.2f)", bc, perObjMS(b.server, n), perObjMS(b.cpu, n))
					if lc > 0 {
						rr = fmt.Sprintf("%.2f", bc/lc)
					}
				}
				fmt.Fprintf(tw, "%s%s\t%d\t%s\t%.2f (%.2f + %.2f)\t%s\n", row.name, suffix, n, cell, lc, perObjMS(l.server, n), perObjMS(l.cpu, n), rr)
			}
		}
	}
	tw.Flush()

	fmt.Fprintln(w, "\ndetails: CPU = user+system time of the process during the phase; writes = new resourceVersions the benchmark's watch saw, per object;\nserver = CPU of kube-apiserver+etcd+kube-controller-manager during the storm; others = CPU of everything else (kernel, other work on the machine;\nthe benchmark's own senders and watch excluded); busy = share of all the machine's CPUs in use during the storm")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "impl\tN\trun\tcreate: sent in / all handled / CPU / writes / server / others / busy\tupdate: sent in / all handled / CPU / writes / server / others / busy\trestart: ready / idle / CPU / writes\tdrain: created in / all handled / CPU\tRSS empty / N idle / peak\tobject\thandler runs (create, update)")
	for _, r := range all {
		if r.err != nil {
			fmt.Fprintf(tw, "%s\t%d\t%d\tFAILED: %s\n", r.variant, r.n, r.rep, truncate(r.err.Error(), 160))
			continue
		}
		runs := "-"
		if r.create.runs >= 0 {
			runs = fmt.Sprintf("%d, %d", r.create.runs, r.update.runs)
		}
		quiet := "-"
		if r.resume.quiet > 0 {
			quiet = secs(r.resume.quiet)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s / %s / %s / %.2f / %s / %s / %.0f%%\t%s / %s / %s / %.2f / %s / %s / %.0f%%\t%s / %s / %s / %d\t%s / %s / %s\t%s / %s / %s\t%d B\t%s\n", r.variant, r.n, r.rep,
			secs(r.create.issue), secs(r.create.total), cpu(r.create.cpu), float64(r.create.writes)/float64(r.n), cpu(r.create.server), cpu(r.create.other), 100*r.create.busy,
			secs(r.update.issue), secs(r.update.total), cpu(r.update.cpu), float64(r.update.writes)/float64(r.n), cpu(r.update.server), cpu(r.update.other), 100*r.update.busy,
			secs(r.resume.took), quiet, cpu(r.resume.cpu), r.resume.writes,
			secs(r.drain.created), secs(r.drain.took), cpu(r.drain.cpu),
			mib(r.rss0), mib(r.rssN), mib(r.firstPeak), r.objBytes, runs)
	}
	tw.Flush()
	for _, r := range all {
		if r.requests != "" {
			fmt.Fprintf(w, "\n%s N=%d run %d: the operator's API requests during the storms (client-side latency):\n%s", r.variant, r.n, r.rep, r.requests)
		}
		if len(r.logLines) == 0 {
			continue
		}
		keys := make([]string, 0, len(r.logLines))
		for k := range r.logLines {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(w, "\n%s N=%d run %d: other log lines (warn and above, or stderr of the reference):\n", r.variant, r.n, r.rep)
		for _, k := range keys {
			fmt.Fprintf(w, "  %6d  %s\n", r.logLines[k], k)
		}
	}
}

func find(results []*runResult, variant string, n int) *runResult {
	for _, r := range results {
		if r.variant == variant && r.n == n {
			return r
		}
	}
	return nil
}

func ok(r *runResult) bool { return r != nil && r.err == nil }

func perObject(r *runResult) float64 {
	if !ok(r) || r.n == 0 || r.rss0 == 0 || r.rssN == 0 {
		return 0
	}
	return float64(r.rssN-r.rss0) / float64(r.n)
}

func rssN(r *runResult) int64 {
	if !ok(r) {
		return 0
	}
	return r.rssN
}

func rate(v float64) string {
	if v <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f", v)
}

func ratio(bare, luaop float64, n int) string {
	if bare <= 0 || luaop <= 0 {
		return "n/a"
	}
	r := luaop / bare
	if n == 1000 {
		verdict := "met"
		if r < 0.9 {
			verdict = "NOT met"
		}
		return fmt.Sprintf("%.2f (aim >= 0.9: %s)", r, verdict)
	}
	return fmt.Sprintf("%.2f", r)
}

func reruns(v int, known bool) string {
	if !known {
		return "-"
	}
	if v == 0 {
		return "0 (aim 0: met)"
	}
	return fmt.Sprintf("%d (aim 0: NOT met)", v)
}

func perSec(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func resumeCell(n int, d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f (%s)", perSec(n, d), secs(d))
}

func ms(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}

func secs(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

func cpu(d time.Duration) string {
	if d <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// aggregate folds the repetitions of each (implementation, N) into one result: the
// median of every figure, except handler runs and re-runs, where the worst run counts.
// A failed run makes the aggregate failed.
func aggregate(results []*runResult) []*runResult {
	type key struct {
		v string
		n int
	}
	groups := map[key][]*runResult{}
	var order []key
	for _, r := range results {
		k := key{r.variant, r.n}
		if _, seen := groups[k]; !seen {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	var out []*runResult
	for _, k := range order {
		g := groups[k]
		agg := &runResult{variant: k.v, n: k.n, measurable: g[0].measurable}
		for _, r := range g {
			if r.err != nil {
				agg.err = r.err
			}
		}
		if agg.err == nil {
			agg.create = aggStorm(g, func(r *runResult) stormResult { return r.create })
			agg.update = aggStorm(g, func(r *runResult) stormResult { return r.update })
			agg.resume = resumeResult{
				took:    med(g, func(r *runResult) time.Duration { return r.resume.took }),
				quiet:   med(g, func(r *runResult) time.Duration { return r.resume.quiet }),
				reruns:  worst(g, func(r *runResult) int { return r.resume.reruns }),
				writes:  worst(g, func(r *runResult) int { return r.resume.writes }),
				peakRSS: med(g, func(r *runResult) int64 { return r.resume.peakRSS }),
				cpu:     med(g, func(r *runResult) time.Duration { return r.resume.cpu }),
			}
			agg.drain = drainResult{
				took:    med(g, func(r *runResult) time.Duration { return r.drain.took }),
				rate:    med(g, func(r *runResult) float64 { return r.drain.rate }),
				p50:     med(g, func(r *runResult) time.Duration { return r.drain.p50 }),
				p99:     med(g, func(r *runResult) time.Duration { return r.drain.p99 }),
				created: med(g, func(r *runResult) time.Duration { return r.drain.created }),
				peakRSS: med(g, func(r *runResult) int64 { return r.drain.peakRSS }),
				cpu:     med(g, func(r *runResult) time.Duration { return r.drain.cpu }),
				runs:    worst(g, func(r *runResult) int { return r.drain.runs - r.n }) + g[0].n,
			}
			agg.rss0 = med(g, func(r *runResult) int64 { return r.rss0 })
			agg.rssN = med(g, func(r *runResult) int64 { return r.rssN })
			agg.firstPeak = med(g, func(r *runResult) int64 { return r.firstPeak })
			agg.objBytes = med(g, func(r *runResult) int { return r.objBytes })
		}
		out = append(out, agg)
	}
	return out
}

func aggStorm(g []*runResult, f func(*runResult) stormResult) stormResult {
	return stormResult{
		total:   med(g, func(r *runResult) time.Duration { return f(r).total }),
		issue:   med(g, func(r *runResult) time.Duration { return f(r).issue }),
		rate:    med(g, func(r *runResult) float64 { return f(r).rate }),
		p50:     med(g, func(r *runResult) time.Duration { return f(r).p50 }),
		p99:     med(g, func(r *runResult) time.Duration { return f(r).p99 }),
		peakRSS: med(g, func(r *runResult) int64 { return f(r).peakRSS }),
		cpu:     med(g, func(r *runResult) time.Duration { return f(r).cpu }),
		runs:    worst(g, func(r *runResult) int { return f(r).runs - r.n }) + g[0].n,
		writes:  med(g, func(r *runResult) int { return f(r).writes }),
		server:  med(g, func(r *runResult) time.Duration { return f(r).server }),
		busy:    med(g, func(r *runResult) float64 { return f(r).busy }),
		self:    med(g, func(r *runResult) time.Duration { return f(r).self }),
		other:   med(g, func(r *runResult) time.Duration { return f(r).other }),
	}
}

// med is the median (the lower middle for an even count).
func med[T int | int64 | float64 | time.Duration](g []*runResult, f func(*runResult) T) T {
	vals := make([]T, 0, len(g))
	for _, r := range g {
		vals = append(vals, f(r))
	}
	slices.Sort(vals)
	return vals[(len(vals)-1)/2]
}

// worst is the value farthest from zero (re-runs: any run that re-ran counts).
func worst(g []*runResult, f func(*runResult) int) int {
	w := f(g[0])
	for _, r := range g[1:] {
		if v := f(r); abs(v) > abs(w) {
			w = v
		}
	}
	return w
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func perObjMS(d time.Duration, n int) float64 {
	return float64(d) / float64(time.Millisecond) / float64(n)
}

// gitDescribe names the code measured: the commit, and "+dirty" when anything luaop
// is built from differs from it.
func gitDescribe(root string) string {
	out, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "(unknown commit)"
	}
	commit := strings.TrimSpace(string(out))
	// Everything but the benchmarks and the e2e tests: a list of packages would go stale.
	st, _ := exec.Command("git", "-C", root, "status", "--porcelain", "--", ".", ":!bench", ":!e2e").Output()
	if len(strings.TrimSpace(string(st))) > 0 {
		commit += "+dirty"
	}
	return commit
}

func memTotal() string {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return "memory unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return fmt.Sprintf("%.1f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return "memory unknown"
}

func kbPerObj(b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f KB/obj", b/1024)
}

// writeBenchScripts writes each scripts folder (dir -> its bench.lua) a scenario
// runs luaop on.
func writeBenchScripts(dirs map[string]string) error {
	for dir, src := range dirs {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "bench.lua"), []byte(src), 0o644); err != nil {
			return err
		}
	}
	return nil
}
