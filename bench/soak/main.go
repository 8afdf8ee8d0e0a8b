package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const resource = "soak.luaop.dev/v1/soakobjects"

var (
	soakGVR = schema.GroupVersionResource{Group: "soak.luaop.dev", Version: "v1", Resource: "soakobjects"}
	crdGVR  = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// daemonScript: a monitors-style daemon. It never changes during the soak, so reloads
// must leave every daemon running (same code hash).
const daemonScript = `-- soak: a daemon per object, following its newest spec (as scripts/examples/monitors.lua).
local luaop = require("luaop")

luaop.daemon("` + resource + `", function(ctx)
  ctx.logger.info("soak daemon up " .. ctx.uid)
  local ticks = 0
  while luaop.sleep(5) do
    ticks = ticks + 1
    local size = ctx.spec.size            -- always the newest spec
    if ticks % 6 == 0 then                -- a status write every 30 s per object
      ctx.patch.status.daemon = { ticks = ticks, size = size }
    end
  end
  ctx.logger.info("soak daemon down " .. ctx.uid)
end, { id = "watcher", cancellation_timeout = 10 })

-- A timer per object: status.ticked.at is its last run.
luaop.timer("` + resource + `", function(ctx)
  return { at = os.time() }
end, { id = "ticked", interval = 120 })
`

// handlersScript is rewritten every reload period with a new revision: the comment and
// the update handler's log line change, nothing else (only on_update's code hash
// changes).
func handlersScript(rev int) string {
	return fmt.Sprintf(`-- soak handlers, revision %d (rewritten by the soak: only this comment and the
-- update handler's log line change between revisions).
local luaop = require("luaop")
local R = "%s"

luaop.on.create(R, function(ctx)
  return { size = ctx.spec.size }                -- status.created
end, { id = "created" })

luaop.on.update(R, function(ctx)
  ctx.logger.info("soak update rev %d size " .. tostring(ctx.spec.size))
  ctx.patch.status.updated = { size = ctx.spec.size }
end, { id = "on_update" })

-- Runs at creation and on every change of spec.size: status.sized.size is the last
-- size handled, which the soak compares with spec.size at the end.
luaop.on.field(R, "spec.size", function(ctx)
  return { size = ctx.new }
end, { id = "sized" })

luaop.on.probe(function(ctx)
  return "ok"
end, { id = "alive" })
`, rev, resource, rev)
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s soak: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

func main() { os.Exit(realMain()) }

type options struct {
	duration, settle, reloadEvery time.Duration
	objects, updates, recreates   int
	workers                       int
	keep                          bool
	// chaos: the chaos run (chaos.go) instead of the soak.
	chaos              bool
	faultMin, faultMax time.Duration
	leaderKillsUntil   float64 // fraction of the churn
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
		fmt.Fprintf(os.Stderr, "soak: %s=%q is not a duration (10m, 90s); using %s\n", name, v, def)
	}
	return def
}

func realMain() int {
	var o options
	flag.DurationVar(&o.duration, "duration", envDuration("SOAK_DURATION", 10*time.Minute), "how long the churn runs (env SOAK_DURATION)")
	flag.DurationVar(&o.settle, "settle", envDuration("SOAK_SETTLE", 2*time.Minute), "after the churn: how long to wait at most for everything to be handled (env SOAK_SETTLE)")
	flag.DurationVar(&o.reloadEvery, "reload-every", 30*time.Second, "period of the script rewrites")
	flag.IntVar(&o.objects, "objects", 500, "objects kept alive")
	flag.IntVar(&o.updates, "updates", 3, "objects whose spec.size changes every second")
	flag.IntVar(&o.recreates, "recreates", 2, "objects deleted and re-created under the same name every second")
	flag.IntVar(&o.workers, "workers", 16, "luaop --workers")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (binary, scripts, luaop's log)")
	flag.BoolVar(&o.chaos, "chaos", false, "the chaos run (make chaos): two replicas under --leader-elect behind a proxy, faults at random intervals, every handler run counted outside the operator")
	flag.DurationVar(&o.faultMin, "fault-min", 90*time.Second, "chaos: the shortest wait between two faults")
	flag.DurationVar(&o.faultMax, "fault-max", 4*time.Minute, "chaos: the longest wait between two faults")
	flag.Float64Var(&o.leaderKillsUntil, "leader-kills-until", 0.3, "chaos: the leader is killed only in this first part of the churn, so that one process serves the second half, whose memory is checked")
	flag.Parse()

	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		fmt.Fprintln(os.Stderr, `soak: LUAOP_TEST_KUBECONFIG is not set. Run it with its own local control plane:

    make soak                      # 10 minutes
    make soak SOAK_DURATION=2m`)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigc
		progress("interrupted: stopping the churn, luaop and cleaning up (again to abort at once)")
		cancel()
		<-sigc
		os.Exit(130)
	}()

	s, err := setup(ctx, kubeconfig, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		if s != nil {
			s.cleanup()
		}
		return 1
	}
	defer s.cleanup()
	var failed bool
	if o.chaos {
		failed = newChaos(s).run(ctx)
	} else {
		failed = s.run(ctx)
	}
	if ctx.Err() != nil {
		return 130
	}
	if failed {
		return 1
	}
	return 0
}

// --- setup --------------------------------------------------------------------------

type soak struct {
	o          options
	kubeconfig string
	tmp        string
	scripts    string
	logPath    string
	ns         string
	dyn        dynamic.Interface
	kube       kubernetes.Interface
	client     dynamic.ResourceInterface
	luaop      *exec.Cmd
	exited     chan struct{}
	exitErr    error
	port       int
	commit     string
	bin        string

	mon monitor
}

func setup(ctx context.Context, kubeconfig string, o options) (*soak, error) {
	s := &soak{o: o, kubeconfig: kubeconfig, exited: make(chan struct{})}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	if u, err := url.Parse(cfg.Host); err != nil || u.Hostname() != "127.0.0.1" {
		return nil, fmt.Errorf("the API server %q is not on 127.0.0.1: the soak only runs against a local control plane", cfg.Host)
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	cfg.UserAgent = "luaop-soak"
	cfg.Timeout = 30 * time.Second
	if s.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if s.kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	s.commit = gitDescribe(root)
	if s.tmp, err = os.MkdirTemp("", "luaop-soak-"); err != nil {
		return nil, err
	}
	bin := filepath.Join(s.tmp, "luaop")
	progress("building ./cmd/luaop (luaop at %s)", s.commit)
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/luaop")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return s, fmt.Errorf("building luaop: %w", err)
	}
	s.scripts = filepath.Join(s.tmp, "scripts")
	_ = os.MkdirAll(s.scripts, 0o755)
	if err := os.WriteFile(filepath.Join(s.scripts, "daemon.lua"), []byte(daemonScript), 0o644); err != nil {
		return s, err
	}
	if err := s.writeHandlers(0); err != nil {
		return s, err
	}
	s.bin = bin
	if err := s.installCRD(ctx); err != nil {
		return s, err
	}
	s.ns = fmt.Sprintf("soak-%05d", rand.IntN(100000))
	if _, err := s.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil {
		return s, fmt.Errorf("creating namespace %s: %w", s.ns, err)
	}
	s.client = s.dyn.Resource(soakGVR).Namespace(s.ns)
	progress("namespace %s; scripts in %s", s.ns, s.scripts)
	if o.chaos {
		return s, nil // chaos.go starts its replicas
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return s, err
	}
	s.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s.logPath = filepath.Join(s.tmp, "luaop.log")
	logf, err := os.Create(s.logPath)
	if err != nil {
		return s, err
	}
	s.luaop = exec.Command(bin, "run", s.scripts, "--kubeconfig", kubeconfig, "--namespaces", s.ns,
		"--workers", strconv.Itoa(o.workers), "--post-events=false", "--log-format=json", "--log-level=info", "--profiles",
		"--health-address=127.0.0.1:"+strconv.Itoa(s.port), "--metrics-address=127.0.0.1:"+strconv.Itoa(s.port), "--metrics-secure=false")
	s.luaop.Stdout, s.luaop.Stderr = logf, logf
	s.luaop.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.luaop.Start(); err != nil {
		logf.Close()
		return s, fmt.Errorf("starting luaop: %w", err)
	}
	go func() { s.exitErr = s.luaop.Wait(); logf.Close(); close(s.exited) }()
	progress("luaop started (pid %d, /readyz on 127.0.0.1:%d, log %s)", s.luaop.Process.Pid, s.port, s.logPath)
	return s, nil
}

func (s *soak) writeHandlers(rev int) error {
	// Written next to it under a hidden name (luaop ignores dotfiles), then renamed:
	// luaop never reads a half-written file.
	tmp := filepath.Join(s.scripts, ".handlers.lua.tmp")
	src := handlersScript(rev)
	if s.o.chaos {
		src = chaosHandlersScript(rev)
	}
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(s.scripts, "handlers.lua"))
}

func (s *soak) installCRD(ctx context.Context) error {
	preserve := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "soakobjects.soak.luaop.dev"},
		"spec": map[string]any{
			"group": "soak.luaop.dev",
			"scope": "Namespaced",
			"names": map[string]any{"plural": "soakobjects", "singular": "soakobject", "kind": "SoakObject"},
			"versions": []any{map[string]any{
				"name": "v1", "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": preserve, "status": preserve},
				}},
			}},
		},
	}}
	client := s.dyn.Resource(crdGVR)
	if _, err := client.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the CRD: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		got, err := client.Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					time.Sleep(2 * time.Second) // the server's warm-up for a new CRD's objects
					return nil
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("CRD %s not Established after 30s", crd.GetName())
}

// cleanup stops luaop, releases the finalizers it left and deletes the namespace
// (bounded: 2 minutes).
func (s *soak) cleanup() {
	if s.luaop != nil && s.luaop.Process != nil {
		select {
		case <-s.exited:
		default:
			_ = s.luaop.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
			case <-time.After(30 * time.Second):
				_ = s.luaop.Process.Kill()
				<-s.exited
			}
		}
	}
	if s.ns != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if list, err := s.client.List(ctx, metav1.ListOptions{}); err == nil {
			for _, item := range list.Items {
				if len(item.GetFinalizers()) > 0 {
					_, _ = s.client.Patch(ctx, item.GetName(), types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
				}
			}
		}
		if err := s.kube.CoreV1().Namespaces().Delete(ctx, s.ns, metav1.DeleteOptions{}); err == nil {
			for ctx.Err() == nil {
				if _, err := s.kube.CoreV1().Namespaces().Get(ctx, s.ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
		}
	}
	if s.tmp != "" {
		if s.o.keep {
			progress("kept %s", s.tmp)
		} else {
			_ = os.RemoveAll(s.tmp)
		}
	}
}

func (s *soak) running() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// --- monitoring: /readyz, /metrics, RSS ----------------------------------------------

type sample struct {
	at         time.Duration // since the churn started (negative: before)
	rss        int64
	heap       float64 // go_memstats_heap_inuse_bytes: spans holding Go objects
	stacks     float64 // go_memstats_stack_inuse_bytes: goroutine stacks
	memOK      bool    // rss, heap and stacks were all read (a failed scrape leaves zeros)
	goroutines float64
	queue      float64
	runs       float64 // luaop_handler_runs_total, all outcomes
}

type monitor struct {
	mu           sync.Mutex
	firstReady   time.Time
	readyProbes  int
	readyBad     int // non-200 (or no answer) after the first ready
	readyBadLast string
	metricsBad   int
	metricsLast  string
	metrics      map[string]float64 // the last scrape, summed by name{label=value} keys of interest
	samples      []sample
	churnStart   time.Time
}

func (s *soak) readyURL() string   { return fmt.Sprintf("http://127.0.0.1:%d/readyz", s.port) }
func (s *soak) metricsURL() string { return fmt.Sprintf("http://127.0.0.1:%d/metrics", s.port) }

// pollReadyz polls /readyz every 250 ms until ctx ends.
func (s *soak) pollReadyz(ctx context.Context) {
	hc := &http.Client{Timeout: 5 * time.Second}
	for ctx.Err() == nil {
		code, body := 0, ""
		resp, err := hc.Get(s.readyURL())
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
		} else {
			body = err.Error()
		}
		if ctx.Err() != nil {
			return
		}
		s.mon.mu.Lock()
		if code == 200 && s.mon.firstReady.IsZero() {
			s.mon.firstReady = time.Now()
		}
		if !s.mon.firstReady.IsZero() {
			s.mon.readyProbes++
			if code != 200 {
				s.mon.readyBad++
				s.mon.readyBadLast = fmt.Sprintf("%s: %d %s", time.Now().Format("15:04:05.000"), code, strings.TrimSpace(body))
			}
		}
		s.mon.mu.Unlock()
		sleep(ctx, 250*time.Millisecond)
	}
}

// pollMetrics scrapes /metrics and reads the RSS every 5 s until ctx ends.
func (s *soak) pollMetrics(ctx context.Context) {
	hc := &http.Client{Timeout: 5 * time.Second}
	for ctx.Err() == nil {
		m, err := scrape(hc, s.metricsURL())
		rss := rssOf(s.luaop.Process.Pid)
		s.mon.mu.Lock()
		if err != nil {
			// Counted once luaop was ready (it listens a little before).
			if ctx.Err() == nil && s.running() && !s.mon.firstReady.IsZero() {
				s.mon.metricsBad++
				s.mon.metricsLast = err.Error()
			}
		} else {
			s.mon.metrics = m
		}
		var at time.Duration
		if !s.mon.churnStart.IsZero() {
			at = time.Since(s.mon.churnStart)
		} else {
			at = -time.Nanosecond
		}
		s.mon.samples = append(s.mon.samples, sample{at: at, rss: rss, heap: m["go_memstats_heap_inuse_bytes"], stacks: m["go_memstats_stack_inuse_bytes"],
			memOK: err == nil && rss > 0 && m["go_memstats_heap_inuse_bytes"] > 0 && m["go_memstats_stack_inuse_bytes"] > 0, goroutines: m["go_goroutines"], queue: m["luaop_queue_depth"], runs: m["luaop_handler_runs_total"]})
		s.mon.mu.Unlock()
		sleep(ctx, 5*time.Second)
	}
}

// scrape reads the Prometheus text format: every sample summed by metric name, and
// by name{label="value"} for the labels the report uses.
func scrape(hc *http.Client, u string) (map[string]float64, error) {
	resp, err := hc.Get(u)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("/metrics: %d", resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		series := line[:sp]
		name, labels, _ := strings.Cut(series, "{")
		out[name] += v
		for _, l := range []string{"outcome", "result", "reason"} {
			if i := strings.Index(labels, l+`="`); i >= 0 {
				rest := labels[i+len(l)+2:]
				if j := strings.IndexByte(rest, '"'); j >= 0 {
					out[name+"{"+l+"="+rest[:j]+"}"] += v
				}
			}
		}
	}
	return out, sc.Err()
}

func rssOf(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// --- the run ------------------------------------------------------------------------

func objectName(i int) string { return fmt.Sprintf("s-%04d", i) }

func newObject(name string, size int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "soak.luaop.dev/v1",
		"kind":       "SoakObject",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"size": int64(size)},
	}}
}

type counters struct {
	updates, updateErrs                      atomic.Int64
	recreated, recreateErrs, recreateSkipped atomic.Int64
	inFlight                                 atomic.Int64
	rewrites                                 atomic.Int64
	mu                                       sync.Mutex
	errs                                     []string // first few errors, with the object
	lastRewriteAt                            time.Time
	lastRewriteRev                           int
}

func (c *counters) err(format string, a ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) < 20 {
		c.errs = append(c.errs, fmt.Sprintf(format, a...))
	}
}

func (s *soak) run(ctx context.Context) (failed bool) {
	mctx, stopMon := context.WithCancel(ctx)
	var mwg sync.WaitGroup
	mwg.Add(2)
	go func() { defer mwg.Done(); s.pollReadyz(mctx) }()
	go func() { defer mwg.Done(); s.pollMetrics(mctx) }()
	defer func() { stopMon(); mwg.Wait() }()

	// Ready.
	deadline := time.Now().Add(90 * time.Second)
	for {
		s.mon.mu.Lock()
		ready := !s.mon.firstReady.IsZero()
		s.mon.mu.Unlock()
		if ready {
			break
		}
		if !s.running() {
			progress("luaop exited before being ready: %v (log: %s)", s.exitErr, s.logPath)
			s.tailLog()
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			progress("luaop not ready after 90s (log: %s)", s.logPath)
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	progress("luaop ready")

	// The population.
	t0 := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var createErr atomic.Value
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= s.o.objects || ctx.Err() != nil {
					return
				}
				err := retry(ctx, func() error {
					_, err := s.client.Create(ctx, newObject(objectName(i), 1+rand.IntN(100)), metav1.CreateOptions{})
					if apierrors.IsAlreadyExists(err) {
						return nil
					}
					return err
				})
				if err != nil {
					createErr.Store(fmt.Errorf("%s: %w", objectName(i), err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := createErr.Load().(error); err != nil {
		progress("creating the objects: %v", err)
		return true
	}
	progress("%d objects created in %s; waiting until all are handled", s.o.objects, time.Since(t0).Round(100*time.Millisecond))
	if st := s.waitConsistent(ctx, 5*time.Minute, "initial"); !st.ok() {
		progress("the initial objects were not all handled within 5 minutes: %s", st.summary())
	}
	progress("all %d handled %s after the first create", s.o.objects, time.Since(t0).Round(100*time.Millisecond))

	// The churn.
	var c counters
	s.mon.mu.Lock()
	s.mon.churnStart = time.Now()
	s.mon.mu.Unlock()
	churnStart := time.Now()
	s.heapProfile(ctx, "heap-start.pb.gz")
	s.churn(ctx, &c)
	churnEnd := time.Now()
	s.heapProfile(ctx, "heap-end.pb.gz")
	progress("churn over after %s: %d spec updates, %d re-creations (%d skipped: name busy), %d script rewrites; waiting for re-creations in flight",
		churnEnd.Sub(churnStart).Round(time.Second), c.updates.Load(), c.recreated.Load(), c.recreateSkipped.Load(), c.rewrites.Load())

	// Settle.
	st := s.waitConsistent(ctx, s.o.settle, "settle")
	settled := time.Since(churnEnd)
	time.Sleep(1 * time.Second)
	// The last readings: metrics now, the log once more.
	hc := &http.Client{Timeout: 5 * time.Second}
	if m, err := scrape(hc, s.metricsURL()); err == nil {
		s.mon.mu.Lock()
		s.mon.metrics = m
		s.mon.mu.Unlock()
	}
	if !st.ok() {
		st = s.check(ctx) // one more, fresh
	}
	stopMon()
	mwg.Wait()
	return s.report(st, &c, churnStart, churnEnd, settled)
}

// churn: every second, spec.size changes on o.updates objects and o.recreates objects
// are deleted and re-created under the same name (in the background: a deletion
// waits for luaop to stop the daemon and release the finalizer); every reloadEvery,
// handlers.lua is rewritten with the next revision.
// heapProfile saves luaop's heap profile (--profiles) into the soak's folder, so that
// what memory holds at the start and at the end of the churn can be compared:
// go tool pprof -diff_base heap-start.pb.gz heap-end.pb.gz (kept with -keep).
func (s *soak) heapProfile(ctx context.Context, name string) {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/heap", s.port), nil)
	if err != nil {
		progress("heap profile %s: %v", name, err)
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		progress("heap profile %s: %v", name, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(s.tmp, name), data, 0o644)
	}
	if err != nil {
		progress("heap profile %s: %v", name, err)
		return
	}
	progress("heap profile saved: %s", filepath.Join(s.tmp, name))
}

func (s *soak) churn(ctx context.Context, c *counters) {
	cctx, cancel := context.WithTimeout(ctx, s.o.duration)
	defer cancel()
	var busy sync.Map // names being re-created
	var wg sync.WaitGroup
	defer func() {
		// Re-creations in flight finish (each is bounded by 90 s).
		wg.Wait()
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	reload := time.NewTicker(s.o.reloadEvery)
	defer reload.Stop()
	report := time.NewTicker(10 * time.Second)
	defer report.Stop()
	start := time.Now()
	rev := 0
	for {
		select {
		case <-cctx.Done():
			return
		case <-s.exited:
			progress("luaop exited during the churn: %v", s.exitErr)
			return
		case <-reload.C:
			rev++
			if err := s.writeHandlers(rev); err != nil {
				c.err("rewriting handlers.lua: %v", err)
				continue
			}
			c.rewrites.Add(1)
			c.mu.Lock()
			c.lastRewriteAt, c.lastRewriteRev = time.Now(), rev
			c.mu.Unlock()
			progress("handlers.lua rewritten (revision %d)", rev)
		case <-report.C:
			s.mon.mu.Lock()
			var rss int64
			if n := len(s.mon.samples); n > 0 {
				rss = s.mon.samples[n-1].rss
			}
			bad, m := s.mon.readyBad, s.mon.metrics
			s.mon.mu.Unlock()
			progress("%s/%s: %d updates, %d re-created (%d in flight, %d failed), %d rewrites; /readyz non-200: %d; RSS %s; queue %.0f; handler runs %.0f (retry %.0f, failure %.0f)",
				time.Since(start).Round(time.Second), s.o.duration, c.updates.Load(), c.recreated.Load(), c.inFlight.Load(), c.recreateErrs.Load(),
				c.rewrites.Load(), bad, mib(rss), m["luaop_queue_depth"], m["luaop_handler_runs_total"],
				m["luaop_handler_runs_total{outcome=retry}"], m["luaop_handler_runs_total{outcome=failure}"])
		case <-tick.C:
			for range s.o.updates {
				name := objectName(rand.IntN(s.o.objects))
				if _, isBusy := busy.Load(name); isBusy {
					continue
				}
				patch := fmt.Sprintf(`{"spec":{"size":%d}}`, 1+rand.IntN(1000))
				// Its own bound, not the churn's: a request sent in the last second
				// must not fail because the churn ends.
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := s.client.Patch(rctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
				rcancel()
				switch {
				case err == nil:
					c.updates.Add(1)
				case apierrors.IsNotFound(err) || ctx.Err() != nil:
				default:
					c.updateErrs.Add(1)
					c.err("%s: spec update: %v", name, err)
				}
			}
			for range s.o.recreates {
				name := objectName(rand.IntN(s.o.objects))
				if _, loaded := busy.LoadOrStore(name, true); loaded || c.inFlight.Load() >= 20 {
					if !loaded {
						busy.Delete(name)
					}
					c.recreateSkipped.Add(1)
					continue
				}
				c.inFlight.Add(1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.inFlight.Add(-1)
					defer busy.Delete(name)
					if err := s.recreate(ctx, name); err != nil {
						c.recreateErrs.Add(1)
						c.err("%s: delete and re-create: %v", name, err)
						return
					}
					c.recreated.Add(1)
				}()
			}
		}
	}
}

// recreate deletes an object, waits until it is gone (luaop stops its daemon and
// releases the finalizer), and creates it again with a new size; bounded by 90 s.
func (s *soak) recreate(parent context.Context, name string) error {
	ctx, cancel := context.WithTimeout(parent, 90*time.Second)
	defer cancel()
	err := s.client.Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete: %w", err)
	}
	t0 := time.Now()
	for {
		_, err := s.client.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("still there %s after its deletion (finalizer not released?)", time.Since(t0).Round(time.Second))
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return retry(ctx, func() error {
		_, err := s.client.Create(ctx, newObject(name, 1+rand.IntN(1000)), metav1.CreateOptions{})
		return err
	})
}

// --- the checks ---------------------------------------------------------------------

// tickedBy: an object this old has had its timer (every 120 s) run at least once.
const tickedBy = 5 * time.Minute

type state struct {
	live          int
	unhandled     []string // live objects whose status.sized.size != spec.size
	deleting      []string // objects still carrying a deletionTimestamp
	notTicked     []string // live objects older than tickedBy without status.ticked (the timer)
	daemonsByName int      // framework log: "daemon started" lines, summed over the names
	badByName     []string // live names the framework's log never started a daemon for
	daemonsByUID  int      // the daemon's own up/down lines, per uid
	badByUID      []string
	err           error
}

func (st state) ok() bool {
	return st.err == nil && len(st.unhandled) == 0 && len(st.deleting) == 0 && len(st.notTicked) == 0 && len(st.badByName) == 0 && len(st.badByUID) == 0 &&
		st.daemonsByUID == st.live
}

func (st state) summary() string {
	if st.err != nil {
		return st.err.Error()
	}
	return fmt.Sprintf("%d live, %d not handled at their spec.size, %d in deletion, %d daemons running (by uid)",
		st.live, len(st.unhandled), len(st.deleting), st.daemonsByUID)
}

// waitConsistent checks every 2 s until everything is consistent or the bound passes.
func (s *soak) waitConsistent(ctx context.Context, bound time.Duration, what string) state {
	deadline := time.Now().Add(bound)
	lastReport := time.Now()
	for {
		st := s.check(ctx)
		if st.ok() || time.Now().After(deadline) || ctx.Err() != nil || !s.running() {
			return st
		}
		if time.Since(lastReport) >= 10*time.Second {
			progress("%s: %s", what, st.summary())
			lastReport = time.Now()
		}
		sleep(ctx, 2*time.Second)
	}
}

func (s *soak) check(ctx context.Context) state {
	var st state
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := s.client.List(lctx, metav1.ListOptions{})
	if err != nil {
		st.err = fmt.Errorf("listing: %w", err)
		return st
	}
	liveNames, liveUIDs := map[string]bool{}, map[string]bool{}
	for _, item := range list.Items {
		if item.GetDeletionTimestamp() != nil {
			st.deleting = append(st.deleting, item.GetName())
			continue
		}
		st.live++
		liveNames[s.ns+"/"+item.GetName()] = true
		liveUIDs[string(item.GetUID())] = true
		if _, ticked, _ := unstructured.NestedFieldNoCopy(item.Object, "status", "ticked", "at"); !ticked && time.Since(item.GetCreationTimestamp().Time) > tickedBy {
			st.notTicked = append(st.notTicked, item.GetName())
		}
		want, _, _ := unstructured.NestedFieldNoCopy(item.Object, "spec", "size")
		got, found, _ := unstructured.NestedFieldNoCopy(item.Object, "status", "sized", "size")
		if !found || !sameNumber(want, got) {
			st.unhandled = append(st.unhandled, fmt.Sprintf("%s (spec.size %v, status.sized.size %v)", item.GetName(), want, got))
		}
	}
	byName, byUID, err := daemonCounts(s.logPath)
	if err != nil {
		st.err = err
		return st
	}
	// The framework's log says when a daemon starts, not always when it ends: a daemon
	// that returns after its stop ends with a success line, logged at debug by `luaop
	// run` (as kopf logs a daemon's exit). The running count is the daemon's own
	// up/down lines per uid; the framework's lines prove every live object got one.
	for _, n := range byName {
		st.daemonsByName += n
	}
	for name := range liveNames {
		if byName[name] == 0 {
			st.badByName = append(st.badByName, fmt.Sprintf("%s (no daemon ever started)", name))
		}
	}
	for uid, n := range byUID {
		st.daemonsByUID += n
		if want := map[bool]int{true: 1, false: 0}[liveUIDs[uid]]; n != want {
			st.badByUID = append(st.badByUID, fmt.Sprintf("%s (%d up, want %d)", uid, n, want))
		}
	}
	for uid := range liveUIDs {
		if _, ok := byUID[uid]; !ok {
			st.badByUID = append(st.badByUID, fmt.Sprintf("%s (no daemon up)", uid))
		}
	}
	sort.Strings(st.unhandled)
	sort.Strings(st.deleting)
	sort.Strings(st.badByName)
	sort.Strings(st.badByUID)
	return st
}

func sameNumber(a, b any) bool {
	f := func(v any) (float64, bool) {
		switch x := v.(type) {
		case int64:
			return float64(x), true
		case float64:
			return x, true
		case json.Number:
			g, err := x.Float64()
			return g, err == nil
		}
		return 0, false
	}
	x, ok1 := f(a)
	y, ok2 := f(b)
	return ok1 && ok2 && x == y
}

// daemonCounts reads luaop's JSON log: per object (namespace/name), the framework's
// "daemon started" lines; per uid, the daemon's own "soak daemon up" minus "soak
// daemon down" (the running count: a daemon's end is not always logged at info).
func daemonCounts(path string) (byName, byUID map[string]int, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	byName, byUID = map[string]int{}, map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !strings.Contains(string(line), "daemon") {
			continue
		}
		var rec struct {
			Msg       string `json:"msg"`
			Namespace string `json:"namespace"`
			Name      string `json:"name"`
		}
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		object := rec.Namespace + "/" + rec.Name // luaop logs them as separate fields
		switch {
		case rec.Msg == "daemon started":
			byName[object]++
		case strings.HasPrefix(rec.Msg, "soak daemon up "):
			byUID[strings.TrimPrefix(rec.Msg, "soak daemon up ")]++
		case strings.HasPrefix(rec.Msg, "soak daemon down "):
			byUID[strings.TrimPrefix(rec.Msg, "soak daemon down ")]--
		}
	}
	return byName, byUID, sc.Err()
}

// logFacts counts, in luaop's log, errors and warnings by message, the reloads
// applied, and whether a revision's update log line appeared.
func logFacts(path string, rev int) (levels map[string]map[string]int, reloaded int, revSeen bool) {
	levels = map[string]map[string]int{}
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	want := fmt.Sprintf("soak update rev %d ", rev)
	for sc.Scan() {
		var rec struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			rec.Level, rec.Msg = "NOT-JSON", truncate(sc.Text(), 100)
		}
		if rec.Msg == "scripts reloaded" {
			reloaded++
		}
		if strings.HasPrefix(rec.Msg, want) {
			revSeen = true
		}
		if rec.Level != "INFO" && rec.Level != "DEBUG" {
			if levels[rec.Level] == nil {
				levels[rec.Level] = map[string]int{}
			}
			levels[rec.Level][truncate(rec.Msg, 100)]++
		}
	}
	return
}

// --- the report ---------------------------------------------------------------------

func (s *soak) report(st state, c *counters, churnStart, churnEnd time.Time, settled time.Duration) (failed bool) {
	s.mon.mu.Lock()
	mon := struct {
		readyProbes, readyBad, metricsBad int
		readyBadLast, metricsLast         string
		metrics                           map[string]float64
		samples                           []sample
	}{s.mon.readyProbes, s.mon.readyBad, s.mon.metricsBad, s.mon.readyBadLast, s.mon.metricsLast, s.mon.metrics, slices.Clone(s.mon.samples)}
	s.mon.mu.Unlock()
	c.mu.Lock()
	lastRev, lastRevAt, errs := c.lastRewriteRev, c.lastRewriteAt, slices.Clone(c.errs)
	c.mu.Unlock()
	levels, reloadedLines, revSeen := logFacts(s.logPath, lastRev)

	fmt.Printf("\nluaop %s; soak of %s (churn %s, settle %s); %d objects; every second %d spec updates and %d delete+re-create; a script rewrite every %s\n\n",
		s.commit, (churnEnd.Sub(churnStart) + settled).Round(time.Second), churnEnd.Sub(churnStart).Round(time.Second), settled.Round(time.Second),
		s.o.objects, s.o.updates, s.o.recreates, s.o.reloadEvery)

	type row struct{ name, result, detail string }
	var rows []row
	add := func(name string, pass bool, detail string) {
		res := "ok"
		if !pass {
			res, failed = "FAILED", true
		}
		rows = append(rows, row{name, res, detail})
	}
	list := func(items []string) string {
		if len(items) == 0 {
			return ""
		}
		if len(items) > 10 {
			return strings.Join(items[:10], ", ") + fmt.Sprintf(", ... (%d in all)", len(items))
		}
		return strings.Join(items, ", ")
	}
	add("luaop still running", s.running(), map[bool]string{true: "", false: fmt.Sprintf("exited: %v", s.exitErr)}[s.running()])
	if st.err != nil {
		add("final listing", false, st.err.Error())
	}
	add("no stuck object (status.sized.size == spec.size)", len(st.unhandled) == 0,
		fmt.Sprintf("%d live objects, %d not handled at their size %s", st.live, len(st.unhandled), list(st.unhandled)))
	add("no object stuck in deletion", len(st.deleting) == 0, fmt.Sprintf("%d %s", len(st.deleting), list(st.deleting)))
	add(fmt.Sprintf("the timer ran on every object older than %s (status.ticked)", tickedBy), len(st.notTicked) == 0,
		fmt.Sprintf("%d without %s", len(st.notTicked), list(st.notTicked)))
	add("every live object's daemon started (framework log, per name)", len(st.badByName) == 0,
		fmt.Sprintf("%d starts logged, %d live %s", st.daemonsByName, st.live, list(st.badByName)))
	add("running daemons == live objects (daemon's own log, per uid)", st.daemonsByUID == st.live && len(st.badByUID) == 0,
		fmt.Sprintf("%d up, %d live %s", st.daemonsByUID, st.live, list(st.badByUID)))
	add("/readyz 200 throughout after the first ready", mon.readyBad == 0 && mon.readyProbes > 0,
		fmt.Sprintf("%d probes, %d not 200 %s", mon.readyProbes, mon.readyBad, mon.readyBadLast))
	add("/metrics answered", mon.metricsBad == 0, fmt.Sprintf("%d failed scrapes %s", mon.metricsBad, mon.metricsLast))
	rewrites := int(c.rewrites.Load())
	okReloads, errReloads := mon.metrics["luaop_reloads_total{result=ok}"], mon.metrics["luaop_reloads_total{result=error}"]
	add("every script rewrite reloaded, none failed", errReloads == 0 && int(okReloads) >= 1+rewrites,
		fmt.Sprintf("%d rewrites; luaop_reloads_total ok=%.0f (1 initial load + reloads) error=%.0f; %d \"scripts reloaded\" log lines", rewrites, okReloads, errReloads, reloadedLines))
	if lastRev > 0 && churnEnd.Sub(lastRevAt) >= 5*time.Second {
		add("the newest update handler runs", revSeen, fmt.Sprintf("revision %d's log line %s", lastRev, map[bool]string{true: "seen", false: "never seen"}[revSeen]))
	}
	add("churn requests succeeded", c.updateErrs.Load() == 0 && c.recreateErrs.Load() == 0,
		fmt.Sprintf("%d spec updates (%d failed), %d re-creations (%d failed, %d skipped: name busy) %s",
			c.updates.Load(), c.updateErrs.Load(), c.recreated.Load(), c.recreateErrs.Load(), c.recreateSkipped.Load(), list(errs)))
	if trend, ok := memoryTrend(mon.samples, churnEnd.Sub(churnStart)); ok {
		add("memory flat over the churn's second half (RSS, heap, stacks: last quarter's mean within 5 % or 1 MiB of the third's)", trend.flat(), trend.String())
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "check\tresult\tdetail")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.name, r.result, strings.TrimSpace(r.detail))
	}
	tw.Flush()

	m := mon.metrics
	fmt.Printf("\nhandler runs (luaop_handler_runs_total): %.0f (success %.0f, retry %.0f, failure %.0f); Lua errors %.0f; patches %.0f; watch events %.0f\n",
		m["luaop_handler_runs_total"], m["luaop_handler_runs_total{outcome=success}"], m["luaop_handler_runs_total{outcome=retry}"],
		m["luaop_handler_runs_total{outcome=failure}"], m["luaop_lua_errors_total"], m["luaop_patches_total"], m["luaop_events_received_total"])
	for _, lvl := range []string{"WARN", "ERROR", "NOT-JSON"} {
		msgs := levels[lvl]
		if len(msgs) == 0 {
			continue
		}
		keys := make([]string, 0, len(msgs))
		for k := range msgs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Printf("luaop log, %s lines:\n", lvl)
		for _, k := range keys {
			fmt.Printf("  %6d  %s\n", msgs[k], k)
		}
	}

	// RSS over time: one line a minute of churn (and the first and last samples).
	fmt.Println("\nmemory over time (VmRSS of luaop; t = since the churn started; queue and goroutines from /metrics):")
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "t\tRSS\theap in use\tstacks\tgoroutines\tqueue\thandler runs")
	var peak int64
	nextMark := time.Duration(0)
	for i, smp := range mon.samples {
		peak = max(peak, smp.rss)
		show := i == len(mon.samples)-1 || (smp.at >= nextMark && smp.at >= 0)
		if i == 0 || show {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\n", fmtAt(smp.at), mib(smp.rss), mib(int64(smp.heap)), mib(int64(smp.stacks)), smp.goroutines, smp.queue, smp.runs)
		}
		if show && smp.at >= nextMark {
			nextMark = (smp.at/time.Minute + 1) * time.Minute
		}
	}
	tw.Flush()
	var atStart, atEnd int64
	for _, smp := range mon.samples {
		if smp.at >= 0 && atStart == 0 {
			atStart = smp.rss
		}
		if smp.at >= 0 {
			atEnd = smp.rss
		}
	}
	fmt.Printf("RSS at the churn's start %s, at the end %s, peak %s\n", mib(atStart), mib(atEnd), mib(peak))
	if trend, ok := memoryTrend(mon.samples, churnEnd.Sub(churnStart)); ok {
		fmt.Println(trend)
	}
	if failed {
		fmt.Printf("\nFAILED (luaop's log: %s)\n", map[bool]string{true: s.logPath, false: "rerun with -keep to keep it"}[s.o.keep])
	} else {
		fmt.Println("\nall checks passed")
	}
	return failed
}

// trend compares the mean of each memory reading over the churn's third quarter with
// its mean over the last: flat when none grew by more than 5 % or, for a reading so
// small that 5 % of it is noise (the goroutine stacks, 2 MiB once sleeping daemons
// hold no goroutine, swing by a few stacks between samples), by more than
// flatNoiseFloor. A memory that keeps
// growing shows in both halves of a long soak; what grows while the operator warms
// up (goroutine stacks reaching their working size, caches filling) shows only in the
// first half, which this check leaves out on purpose. Means, not single samples: the
// heap in use swings by a GC cycle's garbage between two samples.
type trend struct {
	names         []string
	third, fourth []float64
}

func (t trend) flat() bool {
	for i := range t.names {
		if grew := t.fourth[i] - t.third[i]; grew > t.third[i]*0.05 && grew > flatNoiseFloor {
			return false
		}
	}
	return true
}

// flatNoiseFloor is the growth between the quarters' means that trend.flat always
// allows: a leak that small over a soak's quarter is below what it can tell from
// noise (and RSS, which includes every reading, is checked against 5 % too).
const flatNoiseFloor = 1 << 20

func (t trend) String() string {
	parts := make([]string, len(t.names))
	for i, n := range t.names {
		parts[i] = fmt.Sprintf("%s %s -> %s (%+.1f %%)", n, mib(int64(t.third[i])), mib(int64(t.fourth[i])), 100*(t.fourth[i]/t.third[i]-1))
	}
	return "means over the churn's third and fourth quarters: " + strings.Join(parts, ", ")
}

// memoryTrend: false when the churn has too few complete samples (under 4 a quarter;
// a sample is complete when RSS and both /metrics readings were read).
func memoryTrend(samples []sample, end time.Duration) (trend, bool) {
	t := trend{names: []string{"RSS", "heap in use", "stacks"}, third: make([]float64, 3), fourth: make([]float64, 3)}
	var n3, n4 int
	for _, smp := range samples {
		if !smp.memOK {
			continue
		}
		var into []float64
		switch {
		case smp.at >= end/2 && smp.at < end*3/4:
			into, n3 = t.third, n3+1
		case smp.at >= end*3/4 && smp.at <= end:
			into, n4 = t.fourth, n4+1
		default:
			continue
		}
		into[0] += float64(smp.rss)
		into[1] += smp.heap
		into[2] += smp.stacks
	}
	if n3 < 4 || n4 < 4 {
		return trend{}, false
	}
	for i := range 3 {
		t.third[i] /= float64(n3)
		t.fourth[i] /= float64(n4)
	}
	return t, true
}

func fmtAt(d time.Duration) string {
	if d < 0 {
		return "before"
	}
	return d.Round(time.Second).String()
}

// --- small helpers ------------------------------------------------------------------

func (s *soak) tailLog() {
	data, _ := os.ReadFile(s.logPath)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for _, l := range lines[max(0, len(lines)-10):] {
		fmt.Fprintln(os.Stderr, "  "+l)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// retry retries what the API server may answer under load; at most 10 attempts.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		err = f()
		if err == nil || ctx.Err() != nil {
			return err
		}
		var se apierrors.APIStatus
		transport := !errors.As(err, &se)
		if !(transport || apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)) {
			return err
		}
		sleep(ctx, time.Duration(attempt+1)*100*time.Millisecond)
	}
	return err
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

func repoRoot() (string, error) {
	dir, _ := os.Getwd()
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/luaop/luaop\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run the soak from the luaop repository (go run ./bench/soak)")
		}
		dir = parent
	}
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
