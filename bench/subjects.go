package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
)

// benchScript is what luaop runs. Every handler run logs one "RAN <handler>" line at
// warn level (the level luaop runs at here), so the benchmark counts handler runs
// exactly from luaop's stderr: N per storm, and 0 after a restart.
//
//   - create: returns true under id "handled" -> status.handled = true
//   - update: writes status.updated = spec.n through ctx.patch
const benchScript = `local luaop = require("luaop")

luaop.on.create("` + benchResource + `", function(ctx)
  ctx.logger.warn("RAN create")
  return true
end, { id = "handled" })

luaop.on.update("` + benchResource + `", function(ctx)
  ctx.logger.warn("RAN update")
  ctx.patch.status.updated = ctx.spec.n
end, { id = "on_update" })
`

// daemonScript adds a daemon per object that sleeps in a loop: what an idle daemon
// costs. Daemons need a finalizer on every object, added in a cycle of its own
// before the create handler runs (one more write per object).
const daemonScript = benchScript + `
luaop.daemon("` + benchResource + `", function(ctx)
  while luaop.sleep(30) do end
end, { id = "sleeper" })
`

// subject is one implementation under test.
type subject interface {
	name() string
	// measurable: a child process whose RSS and CPU the benchmark can read.
	measurable() bool
	// launch starts it on a namespace. expect > 0 is for the reference only: exit
	// once that many objects are done.
	launch(ns string, expect int, logPath string) (instance, error)
	// finalizers: it puts a finalizer on the objects, to be released (when it is
	// stopped) before the namespace can go.
	finalizers() bool
}

type instance interface {
	ready() bool
	exited() <-chan struct{}
	exitErr() error
	stop() error
	pid() int // 0 when in-process
	// runs counts "RAN <what>" lines in the log; -1 when not applicable.
	runs(what string) int
	logPath() string
}

// --- the reference: bench/bare as a child process -----------------------------------

type bareSubject struct {
	bin, kubeconfig string
	workers         int
}

func (s *bareSubject) name() string     { return "bare" }
func (s *bareSubject) measurable() bool { return true }
func (s *bareSubject) finalizers() bool { return false }

func (s *bareSubject) launch(ns string, expect int, logPath string) (instance, error) {
	c, err := startChild("bare", logPath, s.bin, "-kubeconfig", s.kubeconfig, "-namespace", ns,
		"-workers", strconv.Itoa(s.workers), "-expect", strconv.Itoa(expect))
	if err != nil {
		return nil, err
	}
	return &childInstance{c: c, readyFn: func() bool { return c.stdout.has("synced") }}, nil
}

// --- luaop: the real binary as a child process --------------------------------------

type luaopSubject struct {
	label, bin, scriptsDir, kubeconfig string
	workers                            int
	extra                              []string
	daemons                            bool
}

func (s *luaopSubject) name() string     { return s.label }
func (s *luaopSubject) measurable() bool { return true }
func (s *luaopSubject) finalizers() bool { return s.daemons }

func (s *luaopSubject) launch(ns string, _ int, logPath string) (instance, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	argv := []string{s.bin, "run", s.scriptsDir, "--kubeconfig", s.kubeconfig, "--namespaces", ns,
		"--workers", strconv.Itoa(s.workers), "--post-events=false", "--log-level=warn",
		"--health-address=127.0.0.1:" + strconv.Itoa(port)}
	argv = append(argv, s.extra...)
	c, err := startChild("luaop", logPath, argv...)
	if err != nil {
		return nil, err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
	hc := &http.Client{Timeout: time.Second}
	return &childInstance{c: c, readyFn: func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}}, nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type childInstance struct {
	c       *child
	readyFn func() bool
}

func (i *childInstance) ready() bool             { return i.readyFn() }
func (i *childInstance) exited() <-chan struct{} { return i.c.exited }
func (i *childInstance) exitErr() error          { return i.c.err }
func (i *childInstance) stop() error             { return i.c.stop(30 * time.Second) }
func (i *childInstance) pid() int                { return i.c.pid() }
func (i *childInstance) logPath() string         { return i.c.stderr }
func (i *childInstance) runs(what string) int {
	if i.c.name != "luaop" {
		return -1
	}
	return countLines(i.c.stderr, "RAN "+what)
}

// --- luaop in-process, for profiling ------------------------------------------------

// inprocSubject assembles the operator as cmd/luaop runOperator does (operator.New
// with the same processing options, metrics wiring and client limits), inside the
// benchmark, so that pprof sees it. Its memory and CPU are mixed with the
// benchmark's: not reported.
type inprocSubject struct {
	label, scriptsDir, kubeconfig string
	workers                       int
	requests                      *requestStats
	daemons                       bool
}

func (s *inprocSubject) name() string     { return s.label }
func (s *inprocSubject) measurable() bool { return false }
func (s *inprocSubject) finalizers() bool { return s.daemons }

func (s *inprocSubject) launch(ns string, _ int, logPath string) (instance, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 500, 1000 // as cmd/luaop restConfig
	cfg.UserAgent = "luaop"
	if s.requests != nil {
		cfg.WrapTransport = s.requests.wrap
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	log := slog.New(slog.NewJSONHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	postEvents := false
	m := metrics.New()
	popts := processing.Options{
		Namespaces: []string{ns},
		Workers:    s.workers,
		PostEvents: &postEvents,
		Logger:     log,
	}
	operator.Instrument(&popts, m)
	op, err := operator.New(cfg, operator.Options{ScriptsDir: s.scriptsDir, Processing: popts, Logger: log,
		Runtime: luabind.Options{Logger: log}})
	if err != nil {
		logf.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	i := &inprocInstance{op: op, cancel: cancel, done: make(chan struct{}), log: logPath}
	go func() {
		i.err = op.Start(ctx)
		logf.Close()
		close(i.done)
	}()
	return i, nil
}

type inprocInstance struct {
	op     *operator.Operator
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	log    string
}

func (i *inprocInstance) ready() bool             { return i.op.Ready() }
func (i *inprocInstance) exited() <-chan struct{} { return i.done }
func (i *inprocInstance) exitErr() error          { return i.err }
func (i *inprocInstance) pid() int                { return 0 }
func (i *inprocInstance) logPath() string         { return i.log }
func (i *inprocInstance) runs(what string) int    { return countLines(i.log, "RAN "+what) }
func (i *inprocInstance) stop() error {
	i.cancel()
	select {
	case <-i.done:
		return i.err
	case <-time.After(30 * time.Second):
		return fmt.Errorf("the in-process operator did not stop within 30s")
	}
}
