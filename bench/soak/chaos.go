package main

// The chaos run (`make chaos`): the soak's objects and churn, with two luaop replicas
// under --leader-elect behind testcluster.Proxy, and faults at random intervals:
// kube-apiserver and etcd restarts, the leader killed (SIGKILL), a second writer
// causing 409 storms, the API slowed, a watch answered 410; a script saved every 30 s.
// Every handler run is counted outside the operator (testcluster/ledger: each run
// records itself through luaop.kube, and the objects' every version comes from a
// watch of this program's own), and the end checks README "Semantics": no change
// lost, no succeeded handler run twice, finalizers right, no write on a re-created
// namesake; memory flat over the second half; one daemon per live object.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/luaop/luaop/testcluster"
	"github.com/luaop/luaop/testcluster/ledger"
)

// chaosHandlersScript: a create, an update, a field and a delete handler, each
// recording its runs through the ledger's helper (rewritten every 30 s: only the
// revision in the update handler's comment changes, so only its code hash does).
func chaosHandlersScript(rev int) string {
	return ledger.Script(fmt.Sprintf(`-- chaos handlers, revision %d
local R = "%s"

luaop.on.create(R, function(ctx)
  return ledger.ran(ctx, "created", "create g" .. ctx.spec.gen)
end, { id = "created" })

luaop.on.update(R, function(ctx)
  -- revision %d
  return ledger.ran(ctx, "updated", "update g" .. ctx.old.spec.gen .. "-g" .. ctx.new.spec.gen, ctx.new.spec.gen)
end, { id = "updated" })

luaop.on.field(R, "spec.size", function(ctx)
  return ledger.ran(ctx, "sized", "size " .. tostring(ctx.old) .. "-" .. tostring(ctx.new))
end, { id = "sized" })

luaop.on.delete(R, function(ctx)
  return ledger.ran(ctx, "gone", "delete g" .. ctx.spec.gen)
end, { id = "gone" })

luaop.on.probe(function(ctx)
  return "ok"
end, { id = "alive" })
`, rev, resource, rev))
}

var chaosHandlers = []string{"created", "updated", "sized", "gone"}

var configmapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// stormPrefix is the second writer's: its annotations are marked as an operator's
// (excluded from the essence), so its writes are conflicts and events, no changes
// handlers see.
const stormPrefix = "storm.chaos.luaop.dev"

func chaosObject(name string, incarnation int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "soak.luaop.dev/v1",
		"kind":       "SoakObject",
		"metadata": map[string]any{"name": name, "annotations": map[string]any{
			"ledger.luaop.dev/luaop-managed": "yes", stormPrefix + "/luaop-managed": "yes"}},
		"spec": map[string]any{"incarnation": int64(incarnation), "gen": int64(1), "size": int64(1)},
	}}
}

// replica is one of the two luaop processes; its supervisor starts it again when it
// exits (a Deployment would).
type replica struct {
	name string
	port int
	c    *chaos

	mu      sync.Mutex
	cmd     *exec.Cmd
	logPath string
	starts  int
	exits   []string // why each process ended (killed, or its own exit)
	killing bool
	stopped bool
	exited  chan struct{}

	samples []replicaSample
}

type replicaSample struct {
	sample
	instance int // which start of the replica
	leader   bool
}

type faultRecord struct {
	at     time.Duration
	kind   string
	detail string
}

type chaos struct {
	*soak
	proxy      *testcluster.Proxy
	kubeconfig string // the proxy's
	clusterDir string
	ledger     *ledger.Ledger
	replicas   []*replica
	cms        dynamic.ResourceInterface

	mu         sync.Mutex
	faults     []faultRecord
	churnStart time.Time
	takeovers  []time.Duration // from a leader kill to the other's first handler run

	// The churn's table: the spec it last wrote per name (it is the only writer of
	// spec), so that every update raises spec.gen by one and spec.size never goes
	// back (a field change is named by its old and new values).
	tableMu sync.Mutex
	table   map[string]*objectSpec

	recordsSeen, recordsDeleted atomic.Int64
	deleteQueue                 chan string
	stormWrites, stormConflicts atomic.Int64
}

type objectSpec struct {
	incarnation, gen, size int
}

func newChaos(s *soak) *chaos {
	return &chaos{soak: s, table: map[string]*objectSpec{}, deleteQueue: make(chan string, 1<<20)}
}

func (c *chaos) now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.churnStart.IsZero() {
		return -time.Nanosecond
	}
	return time.Since(c.churnStart)
}

func (c *chaos) note(kind, format string, a ...any) {
	rec := faultRecord{at: c.now(), kind: kind, detail: fmt.Sprintf(format, a...)}
	c.mu.Lock()
	c.faults = append(c.faults, rec)
	c.mu.Unlock()
	progress("fault: %s: %s", kind, rec.detail)
}

func (c *chaos) run(ctx context.Context) (failed bool) {
	if err := c.start(ctx); err != nil {
		progress("chaos: %v", err)
		return true
	}
	defer c.stopReplicas()

	// The population.
	t0 := time.Now()
	if err := c.populate(ctx); err != nil {
		progress("creating the objects: %v", err)
		return true
	}
	progress("%d objects created in %s; waiting until all are handled", c.o.objects, time.Since(t0).Round(100*time.Millisecond))
	if pending := c.waitHandled(ctx, 10*time.Minute, "initial"); len(pending) > 0 {
		progress("the initial objects were not all handled within 10 minutes: %d pending (%s)", len(pending), strings.Join(pending[:min(5, len(pending))], ", "))
	}

	// The churn and the faults.
	c.mu.Lock()
	c.churnStart = time.Now()
	c.mu.Unlock()
	cctx, stopChurn := context.WithTimeout(ctx, c.o.duration)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.injectFaults(cctx) }()
	var ch counters
	go func() { defer wg.Done(); c.churn(cctx, ctx, &ch) }()
	wg.Wait()
	stopChurn()
	churnEnd := time.Now()
	progress("churn over: %d spec updates, %d re-creations, %d script rewrites, %d faults; settling", ch.updates.Load(), ch.recreated.Load(), ch.rewrites.Load(), len(c.faultsSoFar()))

	// Settle: every live object handled at its newest spec, nothing in deletion, every
	// run record observed.
	pending := c.waitHandled(ctx, c.o.settle, "settle")
	settled := time.Since(churnEnd)
	c.drainRecords(ctx)
	var daemons *state
	if leaderLog := c.leaderLog(); leaderLog != "" {
		st := c.daemonState(ctx, leaderLog) // before the stop: it ends the daemons
		daemons = &st
	}
	c.stopReplicas()
	time.Sleep(2 * time.Second) // the ledger's watches deliver the last versions
	return c.report(&ch, churnEnd, settled, pending, daemons)
}

func (c *chaos) faultsSoFar() []faultRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.faults)
}

// start: the proxy, the ledger's watches, the two replicas.
func (c *chaos) start(ctx context.Context) error {
	c.clusterDir = os.Getenv("LUAOP_CLUSTER_DIR")
	if c.clusterDir == "" {
		return fmt.Errorf("LUAOP_CLUSTER_DIR is not set: the chaos restarts the control plane's processes, run it with `make chaos`")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig0())
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	if c.proxy, err = testcluster.StartProxy(cfg, testcluster.ProxyOptions{}); err != nil {
		return err
	}
	if c.kubeconfig, err = writeProxyKubeconfig(c.tmp, c.proxy); err != nil {
		return err
	}
	c.ledger = ledger.New(ledger.Options{Handlers: chaosHandlers, DeleteHandlers: []string{"gone"}})
	c.cms = c.dyn.Resource(configmapsGVR).Namespace(c.ns)
	if _, err := ledger.Follow(ctx, c.client, metav1.ListOptions{}, c.ledger.Observe, c.ledger.Relisted); err != nil {
		return fmt.Errorf("following the objects: %w", err)
	}
	if _, err := ledger.Follow(ctx, c.cms, metav1.ListOptions{LabelSelector: ledger.RunSelector}, c.observeRecord, func(map[string]bool, int64) { c.ledger.Gap() }); err != nil {
		return fmt.Errorf("following the run records: %w", err)
	}
	go c.deleteRecords(ctx)
	for _, name := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		r := &replica{name: name, port: ln.Addr().(*net.TCPAddr).Port, c: c}
		_ = ln.Close()
		c.replicas = append(c.replicas, r)
		if err := r.start(); err != nil {
			return err
		}
		go r.supervise(ctx)
		go r.sample(ctx)
	}
	// Wait for a leader.
	deadline := time.Now().Add(90 * time.Second)
	for c.leader() == nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no replica became leader within 90 s (logs in %s)", c.tmp)
		}
		time.Sleep(200 * time.Millisecond)
	}
	progress("replicas started; %s leads; proxy %s", c.leader().name, c.proxy)
	return nil
}

func (c *chaos) kubeconfig0() string { return c.soak.kubeconfig }

func writeProxyKubeconfig(dir string, p *testcluster.Proxy) (string, error) {
	cfg := p.Env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	path := filepath.Join(dir, "proxy.kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}

// observeRecord takes a run record to the ledger and queues it for deletion (a
// record per run would fill etcd over an hour).
func (c *chaos) observeRecord(eventType string, cm *unstructured.Unstructured) {
	if eventType != "ADDED" {
		return
	}
	if run, ok := ledger.RunFromConfigMap(cm); ok {
		c.ledger.ObserveRun(run)
		c.recordsSeen.Add(1)
		select {
		case c.deleteQueue <- cm.GetName():
		default:
		}
	}
}

func (c *chaos) deleteRecords(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-c.deleteQueue:
			_ = retry(ctx, func() error {
				err := c.cms.Delete(ctx, name, metav1.DeleteOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				return err
			})
			c.recordsDeleted.Add(1)
		}
	}
}

// drainRecords waits (2 minutes at most) until every run record left was observed.
func (c *chaos) drainRecords(ctx context.Context) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		list, err := c.cms.List(ctx, metav1.ListOptions{LabelSelector: ledger.RunSelector})
		if err == nil {
			unseen := 0
			for i := range list.Items {
				if run, ok := ledger.RunFromConfigMap(&list.Items[i]); ok {
					c.ledger.ObserveRun(run) // a record seen before is ignored
					unseen++
				}
			}
			if unseen == 0 || int64(len(list.Items)) <= c.recordsSeen.Load()-c.recordsDeleted.Load() {
				return
			}
		}
		sleep(ctx, time.Second)
	}
}

// --- replicas -----------------------------------------------------------------------

func (r *replica) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts++
	r.logPath = filepath.Join(r.c.tmp, fmt.Sprintf("luaop-%s-%d.log", r.name, r.starts))
	logf, err := os.Create(r.logPath)
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(r.port)
	cmd := exec.Command(r.c.bin, "run", r.c.scripts, "--kubeconfig", r.c.kubeconfig, "--namespaces", r.c.ns,
		"--leader-elect", "--leader-election-namespace", r.c.ns, "--leader-election-name", "chaos",
		"--workers", strconv.Itoa(r.c.o.workers), "--post-events=false", "--log-format=json", "--log-level=info", "--profiles",
		"--health-address="+addr, "--metrics-address="+addr, "--metrics-secure=false")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("starting replica %s: %w", r.name, err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	exited := r.exited
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		r.mu.Lock()
		why := fmt.Sprintf("%v", err)
		if r.killing {
			why, r.killing = "killed by the chaos (SIGKILL)", false
		}
		r.exits = append(r.exits, why)
		r.mu.Unlock()
		close(exited)
	}()
	return nil
}

// supervise starts the replica again 2 s after each exit, until the chaos stops.
func (r *replica) supervise(ctx context.Context) {
	for {
		r.mu.Lock()
		exited := r.exited
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-exited:
		}
		r.mu.Lock()
		stopped := r.stopped
		last := r.exits[len(r.exits)-1]
		r.mu.Unlock()
		if stopped {
			return
		}
		if !strings.HasPrefix(last, "killed by the chaos") {
			r.c.note("replica exit", "replica %s exited by itself (%s): started again", r.name, last)
		}
		sleep(ctx, 2*time.Second)
		if err := r.start(); err != nil {
			progress("%v", err)
			return
		}
	}
}

func (r *replica) startCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts
}

func (r *replica) kill() {
	r.mu.Lock()
	cmd := r.cmd
	r.killing = true
	r.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
}

func (r *replica) stop() {
	r.mu.Lock()
	r.stopped = true
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

func (c *chaos) stopReplicas() {
	for _, r := range c.replicas {
		r.stop()
	}
}

func (r *replica) metricsURL() string { return fmt.Sprintf("http://127.0.0.1:%d/metrics", r.port) }

// sample reads the replica's memory and role every 5 s.
func (r *replica) sample(ctx context.Context) {
	hc := &http.Client{Timeout: 5 * time.Second}
	for ctx.Err() == nil {
		m, err := scrape(hc, r.metricsURL())
		r.mu.Lock()
		pid, instance := 0, r.starts
		if r.cmd != nil && r.cmd.Process != nil {
			pid = r.cmd.Process.Pid
		}
		r.mu.Unlock()
		rss := rssOf(pid)
		smp := replicaSample{instance: instance, leader: err == nil && m["leader_election_master_status"] > 0}
		smp.at = r.c.now()
		smp.rss, smp.heap, smp.stacks = rss, m["go_memstats_heap_inuse_bytes"], m["go_memstats_stack_inuse_bytes"]
		smp.memOK = err == nil && rss > 0 && smp.heap > 0 && smp.stacks > 0
		smp.goroutines, smp.queue, smp.runs = m["go_goroutines"], m["luaop_queue_depth"], m["luaop_handler_runs_total"]
		r.mu.Lock()
		r.samples = append(r.samples, smp)
		r.mu.Unlock()
		sleep(ctx, 5*time.Second)
	}
}

// leader is the replica that leads now (its /metrics says so), or nil.
func (c *chaos) leader() *replica {
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, r := range c.replicas {
		if m, err := scrape(hc, r.metricsURL()); err == nil && m["leader_election_master_status"] > 0 {
			return r
		}
	}
	return nil
}

func (c *chaos) leaderLog() string {
	if l := c.leader(); l != nil {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.logPath
	}
	return ""
}

// --- the population and the churn ---------------------------------------------------

func (c *chaos) populate(ctx context.Context) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= c.o.objects || ctx.Err() != nil {
					return
				}
				name := objectName(i)
				if err := c.createObject(ctx, name, 1); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return err
	}
	return nil
}

func (c *chaos) createObject(ctx context.Context, name string, incarnation int) error {
	err := retry(ctx, func() error {
		_, err := c.client.Create(ctx, chaosObject(name, incarnation), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// A create whose answer was lost: the object is ours if it is this
			// incarnation.
			got, gerr := c.client.Get(ctx, name, metav1.GetOptions{})
			if gerr == nil {
				if n, _, _ := unstructured.NestedInt64(got.Object, "spec", "incarnation"); n == int64(incarnation) {
					return nil
				}
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	c.tableMu.Lock()
	c.table[name] = &objectSpec{incarnation: incarnation, gen: 1, size: 1}
	c.tableMu.Unlock()
	return nil
}

// churn runs until ctx ends; its requests are bounded by their own deadlines under
// parent (one sent in the churn's last second must not fail because the churn ends).
func (c *chaos) churn(ctx, parent context.Context, ch *counters) {
	var busy sync.Map
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	reload := time.NewTicker(c.o.reloadEvery)
	defer reload.Stop()
	report := time.NewTicker(time.Minute)
	defer report.Stop()
	rev := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload.C:
			rev++
			if err := c.writeHandlers(rev); err != nil {
				ch.err("rewriting handlers.lua: %v", err)
				continue
			}
			ch.rewrites.Add(1)
		case <-report.C:
			leader := "none"
			if l := c.leader(); l != nil {
				leader = l.name
			}
			progress("%s/%s: %d updates, %d re-created (%d failed), %d rewrites, %d faults; leader %s; %d runs recorded",
				c.now().Round(time.Second), c.o.duration, ch.updates.Load(), ch.recreated.Load(), ch.recreateErrs.Load(), ch.rewrites.Load(),
				len(c.faultsSoFar()), leader, c.recordsSeen.Load())
		case <-tick.C:
			for range c.o.updates {
				name := objectName(rand.IntN(c.o.objects))
				if _, isBusy := busy.LoadOrStore(name, true); isBusy {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer busy.Delete(name)
					if err := c.update(parent, name); err != nil {
						ch.updateErrs.Add(1)
						ch.err("%s: spec update: %v", name, err)
						return
					}
					ch.updates.Add(1)
				}()
			}
			for range c.o.recreates {
				name := objectName(rand.IntN(c.o.objects))
				if _, loaded := busy.LoadOrStore(name, true); loaded || ch.inFlight.Load() >= 20 {
					if !loaded {
						busy.Delete(name)
					}
					ch.recreateSkipped.Add(1)
					continue
				}
				ch.inFlight.Add(1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer ch.inFlight.Add(-1)
					defer busy.Delete(name)
					if err := c.recreateObject(parent, name); err != nil {
						ch.recreateErrs.Add(1)
						ch.err("%s: delete and re-create: %v", name, err)
						return
					}
					ch.recreated.Add(1)
				}()
			}
		}
	}
}

// update raises spec.gen by one and, every other time, spec.size (the same patch
// until it is answered: one change, even when an answer is lost).
func (c *chaos) update(parent context.Context, name string) error {
	ctx, cancel := context.WithTimeout(parent, 60*time.Second)
	defer cancel()
	c.tableMu.Lock()
	cur := *c.table[name]
	c.tableMu.Unlock()
	next := cur
	next.gen++
	if rand.IntN(2) == 0 {
		next.size++
	}
	patch := fmt.Sprintf(`{"spec":{"gen":%d,"size":%d}}`, next.gen, next.size)
	err := retry(ctx, func() error {
		_, err := c.client.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	})
	if err != nil {
		// Applied or not: the server says (so that spec.size never goes back).
		c.resync(parent, name)
		return err
	}
	c.tableMu.Lock()
	c.table[name] = &next
	c.tableMu.Unlock()
	return nil
}

// resync reads an object's spec back into the table.
func (c *chaos) resync(parent context.Context, name string) {
	ctx, cancel := context.WithTimeout(parent, 2*time.Minute)
	defer cancel()
	var got *unstructured.Unstructured
	if retry(ctx, func() error {
		var err error
		got, err = c.client.Get(ctx, name, metav1.GetOptions{})
		return err
	}) != nil {
		return
	}
	inc, _, _ := unstructured.NestedInt64(got.Object, "spec", "incarnation")
	gen, _, _ := unstructured.NestedInt64(got.Object, "spec", "gen")
	size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size")
	c.tableMu.Lock()
	c.table[name] = &objectSpec{incarnation: int(inc), gen: int(gen), size: int(size)}
	c.tableMu.Unlock()
}

// recreateObject deletes an object, waits until it is gone, and creates its next
// incarnation (bounded by 3 minutes: a control plane restart may come in between).
func (c *chaos) recreateObject(parent context.Context, name string) error {
	ctx, cancel := context.WithTimeout(parent, 3*time.Minute)
	defer cancel()
	c.tableMu.Lock()
	incarnation := c.table[name].incarnation
	c.tableMu.Unlock()
	err := retry(ctx, func() error {
		err := c.client.Delete(ctx, name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	t0 := time.Now()
	for {
		_, err := c.client.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("still there %s after its deletion (finalizer not released?)", time.Since(t0).Round(time.Second))
		}
		sleep(ctx, 200*time.Millisecond)
	}
	return c.createObject(ctx, name, incarnation+1)
}

// --- faults -------------------------------------------------------------------------

type fault struct {
	name string
	do   func(ctx context.Context)
}

func (c *chaos) injectFaults(ctx context.Context) {
	faults := []fault{
		{"kube-apiserver restart", func(ctx context.Context) { c.restart(ctx, "kube-apiserver") }},
		{"etcd restart", func(ctx context.Context) { c.restart(ctx, "etcd") }},
		{"leader killed", c.killLeader},
		{"409 storm", c.storm},
		{"slow API", c.slowAPI},
		{"watch answered 410", c.gone410},
	}
	for i := 0; ; i++ {
		wait := c.o.faultMin + rand.N(c.o.faultMax-c.o.faultMin+1)
		if !sleep(ctx, wait) {
			return
		}
		f := faults[rand.IntN(len(faults))]
		if i < len(faults) {
			f = faults[i] // every kind once first, at random times
		}
		if f.name == "leader killed" && c.now() > time.Duration(float64(c.o.duration)*c.o.leaderKillsUntil) {
			f = faults[3+rand.IntN(3)] // one process serves the second half: its memory is checked
		}
		f.do(ctx)
	}
}

func (c *chaos) restart(ctx context.Context, name string) {
	took, err := testcluster.RestartComponent(ctx, c.clusterDir, name, c.kube)
	if err != nil {
		c.note(name+" restart", "failed: %v", err)
		return
	}
	c.note(name+" restart", "SIGKILL and started again; kube-apiserver ready %s after", took.Round(time.Millisecond))
}

func (c *chaos) killLeader(ctx context.Context) {
	l := c.leader()
	if l == nil {
		c.note("leader killed", "no leader to kill now")
		return
	}
	killedStart := l.startCount()
	killedAt := time.Now()
	l.kill()
	c.note("leader killed", "replica %s (SIGKILL); started again 2 s later as a standby", l.name)
	// The takeover: another process leads (its lease held): the other replica, or the
	// killed one started again, whichever acquires the lease once it expired.
	go func() {
		for ctx.Err() == nil && time.Since(killedAt) < 2*time.Minute {
			if next := c.leader(); next != nil && (next != l || l.startCount() > killedStart) {
				c.mu.Lock()
				c.takeovers = append(c.takeovers, time.Since(killedAt))
				c.mu.Unlock()
				return
			}
			sleep(ctx, 200*time.Millisecond)
		}
	}()
}

// storm: for 60 s, three goroutines patch and update (from a read copy, so that a
// write in between makes it a 409) 100 objects' annotations of a marked prefix.
func (c *chaos) storm(ctx context.Context) {
	names := make([]string, 100)
	for i := range names {
		names[i] = objectName(rand.IntN(c.o.objects))
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	before, conflictsBefore := c.stormWrites.Load(), c.stormConflicts.Load()
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; sctx.Err() == nil; i++ {
				name := names[i%len(names)]
				patch := fmt.Sprintf(`{"metadata":{"annotations":{"%s/tick-%d":"%d"}}}`, stormPrefix, w, i)
				if _, err := c.client.Patch(sctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
					c.stormWrites.Add(1)
				}
				obj, err := c.client.Get(sctx, name, metav1.GetOptions{})
				if err != nil {
					continue
				}
				ann := obj.GetAnnotations()
				if ann == nil {
					ann = map[string]string{}
				}
				ann[fmt.Sprintf("%s/update-%d", stormPrefix, w)] = strconv.Itoa(i)
				obj.SetAnnotations(ann)
				switch _, err := c.client.Update(sctx, obj, metav1.UpdateOptions{}); {
				case err == nil:
					c.stormWrites.Add(1)
				case apierrors.IsConflict(err):
					c.stormConflicts.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	c.note("409 storm", "60 s on 100 objects: %d writes, %d of the second writer's updates refused with 409",
		c.stormWrites.Load()-before, c.stormConflicts.Load()-conflictsBefore)
}

// slowAPI: for 60 s every request of the replicas waits 300 ms to 1 s.
func (c *chaos) slowAPI(ctx context.Context) {
	c.proxy.SetLatency(func(*http.Request) time.Duration { return 300*time.Millisecond + rand.N(700*time.Millisecond) })
	sleep(ctx, 60*time.Second)
	c.proxy.SetLatency(nil)
	c.note("slow API", "60 s of 300 ms to 1 s before every request of the replicas")
}

// gone410: the replicas' watches of the objects are cut, held 5 s and answered
// with 410 Gone; they list again.
func (c *chaos) gone410(ctx context.Context) {
	match := func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/soakobjects") }
	cut := c.proxy.ExpireWatches(match)
	sleep(ctx, 5*time.Second)
	held := c.proxy.HeldWatches()
	c.proxy.AnswerGone()
	c.note("watch answered 410", "%d watches cut, %d held 5 s and answered 410 Gone", cut, held)
}

// --- settle and check ---------------------------------------------------------------

// waitHandled waits until every live object is handled at its newest spec (its
// diff-base at its spec.gen, no progress record, nothing held back) and none is in
// deletion; it returns what is still pending when bound passes.
func (c *chaos) waitHandled(ctx context.Context, bound time.Duration, what string) []string {
	deadline := time.Now().Add(bound)
	last := time.Now()
	for {
		pending := c.pending(ctx)
		if len(pending) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return pending
		}
		if time.Since(last) > 30*time.Second {
			progress("%s: %d objects pending (%s)", what, len(pending), strings.Join(pending[:min(3, len(pending))], ", "))
			last = time.Now()
		}
		sleep(ctx, 2*time.Second)
	}
}

func (c *chaos) pending(ctx context.Context) []string {
	lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	list, err := c.client.List(lctx, metav1.ListOptions{})
	if err != nil {
		return []string{"listing: " + err.Error()}
	}
	var out []string
	for _, item := range list.Items {
		if item.GetDeletionTimestamp() != nil {
			out = append(out, item.GetName()+" (in deletion)")
			continue
		}
		gen, _, _ := unstructured.NestedInt64(item.Object, "spec", "gen")
		if !handledAt(&item, gen) {
			out = append(out, fmt.Sprintf("%s (spec.gen %d not handled)", item.GetName(), gen))
		}
	}
	sort.Strings(out)
	return out
}

// handledAt: the object's stored diff-base is at spec.gen gen, no progress record is
// left, no field handler has a change held back, and the finalizer is on.
func handledAt(obj *unstructured.Unstructured, gen int64) bool {
	raw, _, _ := unstructured.NestedString(obj.Object, "status", "luaop_dev", "last-handled-configuration")
	if raw == "" {
		raw = obj.GetAnnotations()["luaop.dev/last-handled-configuration"]
	}
	var essence struct {
		Spec struct {
			Gen int64 `json:"gen"`
		} `json:"spec"`
		HeldBack map[string]any `json:"luaop.dev/held-back"`
	}
	if raw == "" || json.Unmarshal([]byte(raw), &essence) != nil || essence.Spec.Gen != gen || len(essence.HeldBack) > 0 {
		return false
	}
	if records, _, _ := unstructured.NestedMap(obj.Object, "status", "luaop_dev", "progress"); len(records) > 0 {
		return false
	}
	return slices.Contains(obj.GetFinalizers(), "luaop.dev/finalizer")
}

// chaosOwed: what each incarnation's final state is owed by its handlers.
func chaosOwed(inc ledger.Incarnation) []ledger.Want {
	if inc.Last == nil {
		return nil
	}
	if inc.Deleted || inc.Last.GetDeletionTimestamp() != nil {
		if inc.HeldAtDeletion {
			return []ledger.Want{{Handler: "gone", Why: "its deletion", Match: func(ledger.Run) bool { return true }}}
		}
		return nil
	}
	gen, _, _ := unstructured.NestedInt64(inc.Last.Object, "spec", "gen")
	size, _, _ := unstructured.NestedInt64(inc.Last.Object, "spec", "size")
	wants := []ledger.Want{
		{Handler: "created", Why: "its creation", Match: func(r ledger.Run) bool { return strings.HasPrefix(r.Change, "create") }},
		{Handler: "sized", Why: fmt.Sprintf("the final spec.size %d", size), Match: func(r ledger.Run) bool { return strings.HasSuffix(r.Change, fmt.Sprintf("-%d", size)) }},
	}
	// Changes made before the creation's cause completed are part of it (README:
	// quick changes merge; a cause interrupted by a restart or a leader change is
	// recomputed from the newest state): the update handler serves what came after.
	if inc.FirstHandledGen >= 0 && gen > inc.FirstHandledGen {
		wants = append(wants, ledger.Want{Handler: "updated", Why: fmt.Sprintf("the final spec.gen %d", gen), Match: func(r ledger.Run) bool { return r.Gen == gen }})
	}
	return wants
}

// leaderSeries is the memory of the process (replica and start) that led longest in
// the churn's second half, over the churn.
func (c *chaos) leaderSeries(end time.Duration) (name string, samples []sample, share float64) {
	type key struct {
		r        *replica
		instance int
	}
	count := map[key]int{}
	total := 0
	for _, r := range c.replicas {
		r.mu.Lock()
		for _, s := range r.samples {
			if s.at >= end/2 && s.at <= end {
				total++
				if s.leader {
					count[key{r, s.instance}]++
				}
			}
		}
		r.mu.Unlock()
	}
	var best key
	for k, n := range count {
		if n > count[best] {
			best = k
		}
	}
	if best.r == nil || total == 0 {
		return "", nil, 0
	}
	best.r.mu.Lock()
	defer best.r.mu.Unlock()
	for _, s := range best.r.samples {
		if s.instance == best.instance && s.leader {
			samples = append(samples, s.sample)
		}
	}
	// Both replicas are sampled: half the second half's samples are one replica's.
	return fmt.Sprintf("replica %s (start %d)", best.r.name, best.instance), samples, float64(count[best]) / (float64(total) / float64(len(c.replicas)))
}

func (c *chaos) report(ch *counters, churnEnd time.Time, settled time.Duration, pending []string, daemons *state) (failed bool) {
	churn := churnEnd.Sub(c.churnStart)
	violations := c.ledger.Check(chaosOwed)
	byRule := map[string]int{}
	for _, v := range violations {
		byRule[v.Rule]++
	}
	runs := c.ledger.Runs()
	perHandler := map[string]int{}
	for _, r := range runs {
		perHandler[r.Handler]++
	}
	// Runs again on one change whose success was not stored (a kill or a lost answer
	// between the run and its write): allowed, counted.
	again := 0
	seen := map[string]bool{}
	for _, r := range runs {
		k := r.UID + "|" + r.Handler + "|" + r.Change
		if seen[k] {
			again++
		}
		seen[k] = true
	}
	incs := c.ledger.Incarnations()
	live, deleted := 0, 0
	for _, inc := range incs {
		if inc.Deleted {
			deleted++
		} else {
			live++
		}
	}
	faults := c.faultsSoFar()
	perFault := map[string]int{}
	for _, f := range faults {
		perFault[f.kind]++
	}

	fmt.Printf("\nluaop %s; chaos of %s (churn %s, settle %s); %d objects; every second %d spec updates and %d delete+re-create; a script rewrite every %s; faults every %s to %s\n\n",
		c.commit, (churn + settled).Round(time.Second), churn.Round(time.Second), settled.Round(time.Second),
		c.o.objects, c.o.updates, c.o.recreates, c.o.reloadEvery, c.o.faultMin, c.o.faultMax)

	type row struct{ name, result, detail string }
	var rows []row
	add := func(name string, pass bool, detail string) {
		res := "ok"
		if !pass {
			res, failed = "FAILED", true
		}
		rows = append(rows, row{name, res, detail})
	}
	listOf := func(items []string) string {
		if len(items) > 10 {
			return strings.Join(items[:10], "; ") + fmt.Sprintf("; ... (%d in all)", len(items))
		}
		return strings.Join(items, "; ")
	}
	var vs []string
	for _, v := range violations {
		vs = append(vs, v.String())
	}
	add("0 changes lost (every handler saw the final state it serves)", byRule[ledger.RuleLost] == 0, fmt.Sprintf("%d", byRule[ledger.RuleLost]))
	add("0 succeeded handlers run again on the same change (counted outside the operator)", byRule[ledger.RuleRanTwice] == 0, fmt.Sprintf("%d", byRule[ledger.RuleRanTwice]))
	add("finalizers released exactly when the delete handler ran", byRule[ledger.RuleFinalizer] == 0, fmt.Sprintf("%d", byRule[ledger.RuleFinalizer]))
	add("no write on a re-created namesake", byRule[ledger.RuleNamesake] == 0, fmt.Sprintf("%d", byRule[ledger.RuleNamesake]))
	if len(vs) > 0 {
		add("violations", false, listOf(vs))
	}
	add("every live object handled at its newest spec, finalizer on, none in deletion", len(pending) == 0, fmt.Sprintf("%d pending %s", len(pending), listOf(pending)))
	if gaps := c.ledger.Gaps(); gaps > 0 {
		rows = append(rows, row{"the ledger's watches listed again (410)", "note", fmt.Sprintf("%d times: versions in between unseen (a violation there could go unseen)", gaps)})
	}
	if daemons != nil {
		st := *daemons
		add("running daemons == live objects (the daemons' own up/down lines in the leader's log, per uid)", st.daemonsByUID == st.live && len(st.badByUID) == 0,
			fmt.Sprintf("%d running, %d live %s", st.daemonsByUID, st.live, listOf(st.badByUID)))
		add("every live object's daemon started (the framework's log, per name)", len(st.badByName) == 0,
			fmt.Sprintf("%d starts logged, %d live %s", st.daemonsByName, st.live, listOf(st.badByName)))
		add(fmt.Sprintf("the timer ran on every object older than %s (status.ticked)", tickedBy), len(st.notTicked) == 0,
			fmt.Sprintf("%d without %s", len(st.notTicked), listOf(st.notTicked)))
	} else {
		add("a leader at the end", false, "none")
	}
	name, series, share := c.leaderSeries(churn)
	if t, ok := memoryTrend(series, churn); ok && share >= 0.9 {
		add(fmt.Sprintf("memory flat over the churn's second half (%s, leader %.0f %% of it)", name, 100*share), t.flat(), t.String())
	} else {
		add("memory flat over the churn's second half", false, fmt.Sprintf("no process led through it (longest: %s, %.0f %%)", name, 100*share))
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "check\tresult\tdetail")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.name, r.result, strings.TrimSpace(r.detail))
	}
	_ = tw.Flush()

	fmt.Printf("\nincarnations: %d (%d live, %d deleted); handler runs recorded: %d (%s); runs again on a change whose success was not stored yet (a kill or a lost answer in between): %d\n",
		len(incs), live, deleted, len(runs), mapString(perHandler), again)
	// What the object says of each lost change (was the handler's result stored, with
	// no run record seen, or did it not run at all): the namespace is deleted at the end.
	for _, inc := range incs {
		lost := false
		for _, v := range violations {
			lost = lost || v.Rule == ledger.RuleLost && strings.Contains(v.Detail, inc.UID)
		}
		if !lost || inc.Last == nil {
			continue
		}
		fmt.Printf("  lost on %s (uid %s): %d versions seen, last at resourceVersion %s, first handled spec.gen %d; its last version's bookkeeping:\n",
			inc.Name, inc.UID, inc.Versions, inc.Last.GetResourceVersion(), inc.FirstHandledGen)
		spec, _, _ := unstructured.NestedMap(inc.Last.Object, "spec")
		fmt.Printf("    spec %v; finalizers %v; deletion %v\n", spec, inc.Last.GetFinalizers(), inc.Last.GetDeletionTimestamp())
		for _, h := range chaosHandlers {
			result, _, _ := unstructured.NestedMap(inc.Last.Object, "status", h)
			fmt.Printf("    status.%s %v; annotation %q\n", h, result, inc.Last.GetAnnotations()["ledger.luaop.dev/"+h])
		}
		book, _, _ := unstructured.NestedMap(inc.Last.Object, "status", "luaop_dev")
		fmt.Printf("    status.luaop_dev %v\n", book)
	}
	fmt.Printf("churn: %d spec updates (%d failed), %d re-creations (%d failed, %d skipped); %d script rewrites\n",
		ch.updates.Load(), ch.updateErrs.Load(), ch.recreated.Load(), ch.recreateErrs.Load(), ch.recreateSkipped.Load(), ch.rewrites.Load())
	ch.mu.Lock()
	for _, e := range ch.errs {
		fmt.Printf("  churn error: %s\n", e)
	}
	ch.mu.Unlock()
	fmt.Printf("faults: %d (%s)\n", len(faults), mapString(perFault))
	for _, f := range faults {
		fmt.Printf("  %8s  %-24s %s\n", fmtAt(f.at), f.kind, f.detail)
	}
	c.mu.Lock()
	takeovers := slices.Clone(c.takeovers)
	c.mu.Unlock()
	var tk []string
	for _, d := range takeovers {
		tk = append(tk, d.Round(100*time.Millisecond).String())
	}
	fmt.Printf("takeovers after a leader kill (the kill to another process holding the lease): %s\n", strings.Join(tk, ", "))
	for _, r := range c.replicas {
		r.mu.Lock()
		fmt.Printf("replica %s: %d starts; ends: %s\n", r.name, r.starts, strings.Join(r.exits, "; "))
		r.mu.Unlock()
	}
	if series != nil {
		fmt.Printf("\nmemory of %s over time (t = since the churn started):\n", name)
		tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "t\tRSS\theap in use\tstacks\tgoroutines\tqueue\thandler runs")
		next := time.Duration(0)
		for i, s := range series {
			if i == len(series)-1 || s.at >= next {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\n", fmtAt(s.at), mib(s.rss), mib(int64(s.heap)), mib(int64(s.stacks)), s.goroutines, s.queue, s.runs)
				next = (s.at/(5*time.Minute) + 1) * 5 * time.Minute
			}
		}
		_ = tw.Flush()
		if t, ok := memoryTrend(series, churn); ok {
			fmt.Println(t)
		}
	}
	if failed {
		fmt.Printf("\nFAILED (logs: %s)\n", map[bool]string{true: c.tmp, false: "rerun with -keep to keep them"}[c.o.keep])
	} else {
		fmt.Println("\nall checks passed")
	}
	return failed
}

// daemonState reads the daemons of the leader's log and the timers' marks.
func (c *chaos) daemonState(ctx context.Context, leaderLog string) state {
	prev := c.logPath
	c.logPath = leaderLog
	st := c.check(ctx)
	c.logPath = prev
	return st
}

func mapString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
