package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/luaop/luaop/testcluster"
	"github.com/luaop/luaop/testcluster/ledger"
)

// The fault-injection harness (Sieve, OSDI'22; Acto, SOSP'23): the real `luaop run`
// behind testcluster.Proxy, in a namespace of its own, killed with SIGKILL right
// before or right after a call of a given kind reaches kube-apiserver, shown only the
// last of a burst of changes, or restarted onto an old state; a ledger (the objects'
// history from a watch of the test's own, and a record per handler run that the
// handlers write through luaop.kube) checks README "Semantics" after every run.

// rigBinary is the luaop binary the rigs run, built once per test binary.
var rigBinary struct {
	once sync.Once
	path string
	err  error
}

func luaopBinary(t *testing.T) string {
	t.Helper()
	rigBinary.once.Do(func() {
		dir, err := os.MkdirTemp("", "luaop-faults-bin-")
		if err != nil {
			rigBinary.err = err
			return
		}
		rigBinary.path = filepath.Join(dir, "luaop")
		build := exec.Command("go", "build", "-o", rigBinary.path, "./cmd/luaop")
		build.Dir = testcluster.RepoRoot()
		if out, err := build.CombinedOutput(); err != nil {
			rigBinary.err = fmt.Errorf("building luaop: %v\n%s", err, out)
		}
	})
	if rigBinary.err != nil {
		t.Fatal(rigBinary.err)
	}
	return rigBinary.path
}

// call is one API call of the operator, as the proxy saw it reach kube-apiserver.
type call struct {
	kind   string // one of the callKinds, or "" for calls no fault is injected at
	object string // the name of the object the call is about
	step   string // the workload's step when it came
}

// The kinds of calls a cycle makes (issue 35): faults are injected right before and
// right after each.
const (
	callFinalizerAdd    = "finalizer add"
	callHandlerPatch    = "handler patch"
	callStatusWrite     = "/status write"
	callRecordsPurge    = "records purge"
	callFinalizerRemove = "finalizer removal"
	callEventPost       = "Event post"
	callKube            = "luaop.kube call"
)

var callKinds = []string{callFinalizerAdd, callHandlerPatch, callStatusWrite, callRecordsPurge, callFinalizerRemove, callEventPost, callKube}

// classify names the kind of a request of the operator. The records purge is the write
// that ends a cause: it stores the new last handled state and removes the handlers'
// progress records (in /status with status storage, in the object's merge patch with
// annotations); a write that stores records only is a /status write (or, with
// annotations, a handler patch).
func classify(r *http.Request, body []byte, resource string) (kind, object string) {
	path := strings.Trim(r.URL.Path, "/")
	parts := strings.Split(path, "/")
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/configmaps"):
		return callKube, "configmap"
	case (r.Method == http.MethodPost || r.Method == http.MethodPatch) && (strings.HasSuffix(path, "/events") || strings.Contains(path, "/events/")):
		return callEventPost, "event"
	}
	i := -1
	for k, p := range parts {
		if p == resource {
			i = k
		}
	}
	if i < 0 || i+1 >= len(parts) || r.Method != http.MethodPatch {
		return "", ""
	}
	object = parts[i+1]
	sub := ""
	if i+2 < len(parts) {
		sub = parts[i+2]
	}
	text := string(body)
	if strings.Contains(r.Header.Get("Content-Type"), "json-patch") && strings.Contains(text, `"/metadata/finalizers"`) {
		if strings.Contains(text, "luaop.dev/finalizer") {
			return callFinalizerAdd, object
		}
		return callFinalizerRemove, object
	}
	if strings.Contains(text, "last-handled-configuration") {
		return callRecordsPurge, object
	}
	if sub == "status" {
		return callStatusWrite, object
	}
	return callHandlerPatch, object
}

// injection is one fault: kill the operator at the ordinal-th call (from 1) of kind,
// at stage.
type injection struct {
	kind    string
	ordinal int
	stage   testcluster.Stage
	// about is the call of the reference run it aims at (for messages).
	about call
	// do, when set, is done instead of the kill (the call then goes on).
	do func()
	// lose: the answer is lost (cut after the upstream applied the call) and the
	// operator lives on, as when a connection breaks or a proxy times out.
	lose bool
}

func (in injection) String() string {
	if in.lose {
		return fmt.Sprintf("lose the answer to %s #%d (%s, step %q)", in.kind, in.ordinal, in.about.object, in.about.step)
	}
	return fmt.Sprintf("kill %s %s #%d (%s, step %q)", in.stage, in.kind, in.ordinal, in.about.object, in.about.step)
}

// rig is one namespace, one proxy and the luaop processes run behind it.
type rig struct {
	t          *testing.T
	ns         string
	resource   schema.GroupVersionResource
	proxy      *testcluster.Proxy
	kubeconfig string
	bin        string
	scripts    string
	flags      []string
	ledger     *ledger.Ledger
	stopFollow func()

	mu     sync.Mutex
	op     *process
	ops    []*process // every process started, for the logs of a failure
	step   string
	trace  []call
	counts map[string]int // calls per kind so far
	armed  *injection
	fired  bool
	// stopping: stopAll began; no fault fires from then on (a restart's Add after
	// stopAll's Wait began would misuse the WaitGroup).
	stopping bool
	restarts sync.WaitGroup
}

type rigOptions struct {
	resource schema.GroupVersionResource
	script   string // without the ledger's helper
	handlers []string
	deletes  []string
	flags    []string
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	env.Require(t)
	r := &rig{t: t, ns: env.Namespace(t), resource: o.resource, counts: map[string]int{}, flags: o.flags, bin: luaopBinary(t)}
	r.proxy = env.NewProxy(t, testcluster.ProxyOptions{})
	r.kubeconfig = proxyKubeconfig(t, r.proxy)
	r.scripts = t.TempDir()
	if err := os.WriteFile(filepath.Join(r.scripts, "handlers.lua"), []byte(ledger.Script(o.script)), 0o600); err != nil {
		t.Fatal(err)
	}
	r.ledger = ledger.New(ledger.Options{Handlers: o.handlers, DeleteHandlers: o.deletes})
	ctx, cancel := context.WithCancel(context.Background())
	wait, err := ledger.Follow(ctx, env.Dynamic.Resource(o.resource).Namespace(r.ns), metav1.ListOptions{}, r.ledger.Observe, r.ledger.Relisted)
	if err != nil {
		cancel()
		t.Fatalf("following %s: %v", o.resource.Resource, err)
	}
	r.stopFollow = func() { cancel(); wait() }
	r.proxy.SetInterceptor(r.intercept)
	t.Cleanup(func() {
		r.stopAll()
		r.stopFollow()
		if t.Failed() {
			r.mu.Lock()
			ops := r.ops
			r.mu.Unlock()
			for i, p := range ops {
				t.Logf("the log of luaop run #%d:\n%s", i+1, p.log.String())
			}
		}
	})
	return r
}

// proxyKubeconfig is a kubeconfig for the proxy: its CA, no credentials (the proxy
// adds the cluster's).
func proxyKubeconfig(t *testing.T, p *testcluster.Proxy) string {
	t.Helper()
	c := p.Env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["proxy"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	kc.AuthInfos["proxy"] = &clientcmdapi.AuthInfo{}
	kc.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "proxy"}
	kc.CurrentContext = "proxy"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// start starts a `luaop run` behind the proxy; it becomes the one faults kill.
func (r *rig) start() *process {
	r.t.Helper()
	p, err := r.startProcess()
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

// startProcess is start for any goroutine.
func (r *rig) startProcess() (*process, error) {
	p := &process{log: &testcluster.LogBuffer{}}
	level := "info"
	if os.Getenv("LUAOP_FAULTS_DEBUG") == "1" {
		level = "debug" // the operator's log of a failing run says why a handler ran
	}
	args := append([]string{"run", "--kubeconfig", r.kubeconfig, "--namespaces", r.ns,
		"--health-address=", "--metrics-address=", "--post-events=true", "--log-level", level,
		"--consistency-timeout", "2s", "--workers", "4"}, r.flags...)
	p.cmd = exec.Command(r.bin, append(args, r.scripts)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting luaop run: %w", err)
	}
	r.mu.Lock()
	r.op = p
	r.ops = append(r.ops, p)
	r.mu.Unlock()
	return p, nil
}

// kill kills the current process with SIGKILL and waits until it is gone.
func (r *rig) kill() {
	r.mu.Lock()
	p := r.op
	r.op = nil
	r.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
}

// stop stops the current process with SIGTERM (a clean stop).
func (r *rig) stop() {
	r.mu.Lock()
	p := r.op
	r.op = nil
	r.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

func (r *rig) stopAll() {
	r.mu.Lock()
	r.stopping = true
	r.mu.Unlock()
	r.restarts.Wait()
	r.stop()
	r.mu.Lock()
	ops := r.ops
	r.mu.Unlock()
	for _, p := range ops {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	}
}

// setStep names the workload's step, for the calls that come next.
func (r *rig) setStep(step string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.step = step
}

// arm makes the rig kill the operator at in, and start a new one at once.
func (r *rig) arm(in injection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.fired = &in, false
}

func (r *rig) firedYet() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fired
}

// intercept is the proxy's interceptor: it traces the operator's calls and fires the
// armed injection.
func (r *rig) intercept(x *testcluster.Exchange) testcluster.Verdict {
	kind, object := classify(x.Request, x.Body, r.resource.Resource)
	if kind == "" {
		return testcluster.Forward
	}
	r.mu.Lock()
	if x.Stage == testcluster.BeforeUpstream {
		r.counts[kind]++
		r.trace = append(r.trace, call{kind: kind, object: object, step: r.step})
	}
	in := r.armed
	hit := in != nil && !r.fired && !r.stopping && in.kind == kind && in.stage == x.Stage && r.counts[kind] == in.ordinal
	if x.Stage == testcluster.AfterUpstream && hit && x.Status >= 300 {
		// The server refused it: nothing applied, nothing to crash after. The next
		// call of the kind is the one.
		in.ordinal++
		hit = false
	}
	if hit {
		r.fired = true
		r.restarts.Add(1)
	}
	r.mu.Unlock()
	if !hit {
		return testcluster.Forward
	}
	if in.do != nil {
		in.do()
		r.restarts.Done()
		return testcluster.Forward
	}
	if in.lose {
		r.restarts.Done()
		return testcluster.Cut
	}
	r.kill()
	go func() {
		defer r.restarts.Done()
		if _, err := r.startProcess(); err != nil {
			r.t.Errorf("restarting after %s: %v", in, err)
		}
	}()
	return testcluster.Cut
}

// processes is how many luaop processes the rig started.
func (r *rig) processes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ops)
}

// calls is the trace so far.
func (r *rig) calls() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]call(nil), r.trace...)
}

// current is the live incarnation of name the ledger knows last, or nil.
func (r *rig) current(name string) *ledger.Incarnation {
	incs := r.ledger.Incarnations()
	for i := len(incs) - 1; i >= 0; i-- {
		if incs[i].Name == r.ns+"/"+name && !incs[i].Deleted {
			return &incs[i]
		}
	}
	return nil
}

// handledGen is the spec.gen of an object's last handled state (its diff-base), and
// whether the cause is over (no progress record left, no field handler with a change
// held back for it).
func handledGen(obj *unstructured.Unstructured) (int64, bool) {
	base, ok := diffBaseOf(obj)
	if !ok {
		return -1, false
	}
	var essence struct {
		Spec struct {
			Gen int64 `json:"gen"`
		} `json:"spec"`
		// Field handlers that were out of their filter have a change still to see.
		HeldBack map[string]any `json:"luaop.dev/held-back"`
	}
	if err := json.Unmarshal([]byte(base), &essence); err != nil {
		return -1, false
	}
	if len(essence.HeldBack) > 0 {
		return essence.Spec.Gen, false
	}
	records, _, _ := unstructured.NestedMap(obj.Object, "status", "luaop_dev", "progress")
	for k := range obj.GetAnnotations() {
		if strings.HasPrefix(k, "luaop.dev/") && k != "luaop.dev/last-handled-configuration" && k != "luaop.dev/luaop-managed" {
			return essence.Spec.Gen, false
		}
	}
	return essence.Spec.Gen, len(records) == 0
}

// waitHandledGen waits until the ledger saw the live incarnation of name handled at
// spec.gen gen (its diff-base, no records left; and the finalizer on, when held), and
// returns its uid.
func (r *rig) waitHandledGen(name string, gen int64, held bool, timeout time.Duration) string {
	r.t.Helper()
	var uid string
	testcluster.Eventually(r.t, timeout, func() (bool, string) {
		inc := r.current(name)
		if inc == nil {
			return false, "waiting for " + name + " to exist"
		}
		got, over := handledGen(inc.Last)
		hasFinalizer := false
		for _, f := range inc.Last.GetFinalizers() {
			hasFinalizer = hasFinalizer || f == "luaop.dev/finalizer"
		}
		uid = inc.UID
		return got == gen && over && hasFinalizer == held,
			fmt.Sprintf("waiting for %s (uid %s) to be handled at spec.gen %d: handled %d, cause over %v, finalizer %v", name, inc.UID, gen, got, over, hasFinalizer)
	})
	return uid
}

// waitGone waits until the ledger saw the incarnation uid deleted.
func (r *rig) waitGone(uid string, timeout time.Duration) {
	r.t.Helper()
	testcluster.Eventually(r.t, timeout, func() (bool, string) {
		for _, inc := range r.ledger.Incarnations() {
			if inc.UID == uid {
				return inc.Deleted, fmt.Sprintf("waiting for %s (uid %s) to be gone (finalizer %v)", inc.Name, uid, inc.Last.GetFinalizers())
			}
		}
		return false, "waiting for uid " + uid
	})
}

// check reads the run records and applies the ledger's rules; it returns the
// violations (each logged).
func (r *rig) check(owed func(ledger.Incarnation) []ledger.Want) []ledger.Violation {
	r.t.Helper()
	list, err := env.Dynamic.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(r.ns).
		List(r.t.Context(), metav1.ListOptions{LabelSelector: ledger.RunSelector})
	if err != nil {
		r.t.Fatalf("listing the run records: %v", err)
	}
	for i := range list.Items {
		if run, ok := ledger.RunFromConfigMap(&list.Items[i]); ok {
			r.ledger.ObserveRun(run)
		}
	}
	if gaps := r.ledger.Gaps(); gaps > 0 {
		r.t.Logf("the ledger's watch missed versions %d times (410): a violation may go unseen", gaps)
	}
	return r.ledger.Check(owed)
}

// runsSummary lists the runs per handler and incarnation, for logs.
func (r *rig) runsSummary() string {
	var b strings.Builder
	for _, inc := range r.ledger.Incarnations() {
		fmt.Fprintf(&b, "%s uid %s (incarnation %d, %d versions, deleted %v):", inc.Name, inc.UID, inc.Incarnation, inc.Versions, inc.Deleted)
		for _, run := range inc.Runs {
			fmt.Fprintf(&b, " %s[%s]@%d", run.Handler, run.Change, run.RV)
		}
		b.WriteString("\n")
	}
	return b.String()
}
