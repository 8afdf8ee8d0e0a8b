package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/eventing"
	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/kubeclient"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptsource"
)

// Options configure an Operator. The zero value of every field means its default.
type Options struct {
	// ScriptsDir is the folder of Lua scripts. Required unless Scripts is set.
	ScriptsDir string
	// Scripts, when set, are loaded instead of reading ScriptsDir (tests, embedding).
	Scripts []luabind.Script
	// Processing and Runtime configure the two halves; see their documentation.
	Processing processing.Options
	Runtime    luabind.Options
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// ProbeCache is how long the results of successful on.probe handlers are reused
	// by Probe (kopf's probe cache), so that the kubelet does not run Lua on every
	// liveness probe. Defaults to 10s; a negative value disables the cache. Failed
	// probes are never cached.
	ProbeCache time.Duration
	// FieldManager names the operator in managedFields for the scripts' server-side
	// applies and writes (luaop.kube), when New makes their client. Defaults to
	// "luaop"; two operators on the same objects need different ones, or each
	// overwrites the other's applied fields without a conflict (FieldManagerFor).
	FieldManager string
}

// FieldManagerFor is the field manager of an operator with the given --prefix:
// "luaop" for the default prefix luaop.dev (what earlier versions wrote), else
// "luaop-<prefix>".
func FieldManagerFor(prefix string) string {
	if prefix == "" || prefix == "luaop.dev" {
		return "luaop"
	}
	return "luaop-" + prefix
}

// DefaultProbeCache is kopf's probe cache duration.
const DefaultProbeCache = 10 * time.Second

// Operator is one running operator.
type Operator struct {
	opts    Options
	cfg     *rest.Config
	runtime *luabind.Runtime
	reactor *processing.Reactor
	log     *slog.Logger
	loaded  atomic.Bool
	// lastGood: the scripts serving are the last good ones (NoteLastGood).
	lastGood atomic.Bool
	// lastReload is the outcome of the last load of the scripts (NoteReload).
	lastReload atomic.Pointer[ReloadStatus]
	// stopEvents shuts down the Events recorder New made (a no-op if it made none).
	stopEvents func()

	// probeSem serialises probe runs (kopf: one probing at a time); probeCached
	// is the last successful result and when it was taken.
	probeSem    chan struct{}
	probeMu     sync.Mutex
	probeCached map[string]any
	probeAt     time.Time
	// hookSleep waits between attempts of startup and cleanup handlers (tests
	// shorten it).
	hookSleep func(ctx context.Context, d time.Duration) error
	hookNow   func() time.Time
}

// New prepares an operator; nothing runs until Start.
func New(cfg *rest.Config, opts Options) (*Operator, error) {
	if opts.ScriptsDir == "" && opts.Scripts == nil {
		return nil, errors.New("no scripts: give a scripts folder")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Runtime.Logger == nil {
		opts.Runtime.Logger = opts.Logger
	}
	if opts.Processing.Logger == nil {
		opts.Processing.Logger = opts.Logger
	}
	// One Events recorder for the whole operator: the framework's Events and the
	// scripts' luaop.info/warn/exception share its rate limit and aggregation. With
	// PostEvents off there is none: processing posts nothing, and the scripts' calls
	// are checked but post nothing (they still return true).
	post := opts.Processing.PostEvents == nil || *opts.Processing.PostEvents
	stopEvents := func() {}
	if post && opts.Processing.Recorder == nil {
		rec, err := eventing.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("creating the events client: %w", err)
		}
		opts.Processing.Recorder, stopEvents = rec, rec.Shutdown
	}
	var madeKube *kubeclient.Client
	if opts.Runtime.Kube == nil {
		kube, err := kubeclient.New(cfg)
		if err != nil {
			stopEvents()
			return nil, fmt.Errorf("creating the scripts' cluster client: %w", err)
		}
		if post {
			kube.Recorder = opts.Processing.Recorder
		}
		if opts.FieldManager != "" {
			kube.FieldManager = opts.FieldManager
		}
		opts.Runtime.Kube, madeKube = kube, kube
	}
	rt := luabind.New(opts.Runtime)
	if budget := rt.MemoryBudget(); budget > 0 {
		source := "--lua-memory-budget"
		if opts.Runtime.MemoryBudget == 0 {
			_, source = luabind.DefaultMemoryBudget()
		}
		opts.Logger.Info("lua memory budget", "budget", luabind.FormatBytes(uint64(budget)), "from", source)
	}
	reactor, err := processing.New(cfg, scriptHandlers{rt}, opts.Processing)
	if err != nil {
		rt.Close()
		stopEvents()
		return nil, err
	}
	if madeKube != nil {
		// The scripts' reads are answered from the watches' cache (a client given
		// in Options reads as it was made).
		madeKube.Cache = reactor.Cache()
	}
	if opts.ProbeCache == 0 {
		opts.ProbeCache = DefaultProbeCache
	}
	return &Operator{opts: opts, cfg: cfg, runtime: rt, reactor: reactor, log: opts.Logger, stopEvents: stopEvents,
		probeSem: make(chan struct{}, 1), hookSleep: sleepCtx, hookNow: time.Now}, nil
}

// Runtime gives access to the loaded scripts (reloads, hooks, live views).
func (o *Operator) Runtime() *luabind.Runtime { return o.runtime }

// Reactor gives access to the processing core.
func (o *Operator) Reactor() *processing.Reactor { return o.reactor }

// Pause stops the operator taking work (no new cycles, daemons and timers stopped,
// everything it knows kept) and returns once the work in flight has ended; Resume
// undoes it. Peering drives them (processing.Reactor.Pause). Operator-level hooks
// and the admission webhooks are not paused.
func (o *Operator) Pause(ctx context.Context, reason string) error {
	return o.reactor.Pause(ctx, reason)
}

// Resume lets a paused operator work again.
func (o *Operator) Resume() { o.reactor.Resume() }

// Ready tells whether the scripts are loaded and the initial listing is processed.
func (o *Operator) Ready() bool { return o.loaded.Load() && o.reactor.Synced() }

// Load (re)reads the scripts and makes them current if they all load; otherwise the
// previous ones keep serving and the error, with file:line, is returned.
func (o *Operator) Load(ctx context.Context) (luabind.LoadReport, error) {
	scripts := o.opts.Scripts
	if scripts == nil {
		var err error
		if scripts, err = scriptsource.ReadDir(o.opts.ScriptsDir); err != nil {
			return luabind.LoadReport{}, err
		}
	}
	return o.LoadScripts(ctx, scripts)
}

// LoadScripts makes a new script set current (a reload), atomically: if any file
// fails, nothing changes. Memos, running daemons with unchanged code, timers and
// handler progress are kept; the new handlers serve the next causes at once.
func (o *Operator) LoadScripts(ctx context.Context, scripts []luabind.Script) (luabind.LoadReport, error) {
	if len(scripts) == 0 {
		return luabind.LoadReport{}, fmt.Errorf("no *.lua files in %s", o.opts.ScriptsDir)
	}
	report, err := o.runtime.Load(ctx, scripts)
	if err != nil {
		return report, err
	}
	o.loaded.Store(true)
	// The probes' cached results are the previous scripts': the next /readyz or
	// /healthz runs the new ones (a probe changed or removed by the edit answers
	// at once, not after the cache's 10 s).
	o.probeMu.Lock()
	o.probeCached = nil
	o.probeMu.Unlock()
	o.reactor.Refresh()
	return report, nil
}

// Start loads the scripts and runs until ctx is done. A first load that fails stops
// the start: there is nothing to serve yet.
func (o *Operator) Start(ctx context.Context) error {
	// Deferred first so it runs last: cleanup handlers may still post Events.
	defer o.stopEvents()
	defer o.runtime.Close()
	if !o.loaded.Load() {
		report, err := o.Load(ctx)
		if err != nil {
			return fmt.Errorf("loading the scripts: %w", err)
		}
		o.log.Info("scripts loaded", "files", len(report.Files), "handlers", len(report.Handlers), "took_ms", float64(report.Took.Microseconds())/1000)
		for _, h := range report.Handlers {
			o.log.Debug("handler", "id", h.ID, "kind", string(h.Kind), "resource", h.Resource.String(), "at", h.Source)
		}
	}
	if err := o.runHooks(ctx, causes.KindStartup); err != nil {
		return fmt.Errorf("%w; the operator does not start: fix the startup handler, or what it checks", err)
	}
	err := o.reactor.Start(ctx)
	o.runCleanup(ctx)
	return err
}

// runCleanup runs the cleanup handlers after the last cycle, with a fresh deadline
// of their own, unless the operator was told to stop writing at once: a replica
// that lost its shard membership must write nothing more (the others are taking
// its objects, and cleanup handlers write through luaop.kube). kopf has no such
// stop; its cleanup runs on every exit.
func (o *Operator) runCleanup(ctx context.Context) {
	if o.stoppedAtOnce() {
		o.log.Warn("cleanup handlers not run: the operator was told to stop writing at once (its shard membership was lost)")
		return
	}
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := o.runHooks(cleanupCtx, causes.KindCleanup); err != nil {
		o.log.Error("cleanup handler failed", "error", err)
	}
}

// stoppedAtOnce tells whether processing's StopAtOnce was closed.
func (o *Operator) stoppedAtOnce() bool {
	select {
	case <-o.opts.Processing.StopAtOnce:
		return true
	default:
		return false
	}
}

// runHooks runs the operator-level handlers of one kind (startup, cleanup) as kopf
// runs activities: every handler is tried in registration order, and those that
// failed are retried until they succeed: after a TemporaryError's delay, or after
// the handler's backoff (60s by default) for other errors. A PermanentError, the
// errors = "permanent" option, or running out of the handler's retries or timeout
// fails it for good; errors = "ignored" counts a failure as done. The run ends when
// every handler is done, with the first failure if any, or when ctx ends.
func (o *Operator) runHooks(ctx context.Context, kind causes.Kind) error {
	type hookState struct {
		spec    causes.Spec
		started time.Time
		retries int
		next    time.Time
		done    bool
	}
	var hooks []*hookState
	for _, h := range o.runtime.Hooks() {
		if h.Kind == kind {
			hooks = append(hooks, &hookState{spec: h})
		}
	}
	var failed error
	for {
		now := o.hookNow()
		var wake time.Time
		pending := false
		for _, h := range hooks {
			if h.done {
				continue
			}
			if h.next.After(now) {
				pending = true
				if wake.IsZero() || h.next.Before(wake) {
					wake = h.next
				}
				continue
			}
			if h.started.IsZero() {
				h.started = now
			}
			o.log.Info("running "+string(kind)+" handler", "handler", h.spec.ID, "reason", string(kind), "retry", h.retries)
			t0 := time.Now()
			_, err := o.runtime.Invoke(ctx, causes.Call{Handler: h.spec, Retry: h.retries, Started: h.started,
				Runtime: now.Sub(h.started), Logger: o.log.With("handler", h.spec.ID, "reason", string(kind)), Indexes: o.reactor.Indexes()})
			// The fields of every handler's outcome line (processing logs them alike).
			fields := []any{"handler", h.spec.ID, "reason", string(kind), "took_ms", float64(time.Since(t0).Microseconds()) / 1000}
			if ctx.Err() != nil {
				return fmt.Errorf("%s handler %s: %w", kind, h.spec.ID, ctx.Err())
			}
			spec := handling.WithBackoff(h.spec, o.opts.Processing.DefaultBackoff) // 0: kopf's 60 s
			v := handling.Judge(spec, handling.Attempt{Retries: h.retries, Runtime: o.hookNow().Sub(h.started)}, err)
			if v.Outcome == handling.OutcomeSuccess || v.Outcome == handling.OutcomeIgnored {
				if err != nil {
					o.log.Warn("handler failed; ignored as configured (errors=ignored)", append(fields, "error", err)...)
				} else {
					o.log.Log(ctx, o.opts.Processing.SuccessLogLevel, "handler succeeded", fields...)
				}
				h.done = true
				continue
			}
			h.retries++
			if v.Outcome == handling.OutcomeFailure {
				err = handling.Failed(h.spec, v, err) // names the handler once
				h.done = true
				o.log.Error("handler failed for good", append(fields, "error", err)...)
				if failed == nil {
					failed = fmt.Errorf("%s %w", kind, err)
				}
				continue
			}
			retryIn := v.Delay
			at := o.hookNow().Add(retryIn)
			o.log.Warn("handler will be retried", append(fields, "error", err, "retry", h.retries, "in", retryIn)...)
			h.next = at
			pending = true
			if wake.IsZero() || at.Before(wake) {
				wake = at
			}
		}
		if !pending {
			return failed
		}
		if err := o.hookSleep(ctx, wake.Sub(o.hookNow())); err != nil {
			return fmt.Errorf("%s handlers did not succeed before the operator stopped: %w", kind, err)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Probe runs the on.probe handlers and returns their results by handler id, and
// whether all of them succeeded; a failed probe gives its error message.
//
// Probes run under ctx (the request's) bounded by a probe deadline of 800ms, below
// the kubelet's default probe timeout (1s), so that /healthz always answers in time.
// A probe that has not finished by then (its Lua state busy, or the probe itself
// slow) is reported as {"error": "probe did not finish within 800ms: ..."}, and Probe
// returns without waiting for it. Probes run on the runtime's state for
// operator-level hooks, not behind object handlers.
//
// Successful results are cached for Options.ProbeCache (10s by default, like kopf):
// within that time Probe returns them without running Lua. Probes run one at a time.
func (o *Operator) Probe(ctx context.Context) (map[string]any, bool) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if o.opts.ProbeCache <= 0 {
		return o.probe(ctx)
	}
	if res, ok := o.cachedProbe(); ok {
		return res, true
	}
	select {
	case o.probeSem <- struct{}{}:
		defer func() { <-o.probeSem }()
	case <-ctx.Done():
		return map[string]any{"probe": fmt.Sprintf("another probe did not finish within %s", probeTimeout)}, false
	}
	if res, ok := o.cachedProbe(); ok { // the run we waited for
		return res, true
	}
	res, healthy := o.probe(ctx)
	if healthy {
		o.probeMu.Lock()
		o.probeCached, o.probeAt = res, time.Now()
		o.probeMu.Unlock()
	}
	return res, healthy
}

const probeTimeout = 800 * time.Millisecond

// cachedProbe returns a copy of the cached results if they are fresh.
func (o *Operator) cachedProbe() (map[string]any, bool) {
	o.probeMu.Lock()
	defer o.probeMu.Unlock()
	if o.probeCached == nil || time.Since(o.probeAt) >= o.opts.ProbeCache {
		return nil, false
	}
	out := make(map[string]any, len(o.probeCached))
	for k, v := range o.probeCached {
		out[k] = v
	}
	return out, true
}

// probe runs the probes once, under ctx (bounded by the probe deadline).
func (o *Operator) probe(ctx context.Context) (map[string]any, bool) {
	type outcome struct {
		res causes.Result
		err error
	}
	late := func(err error) map[string]any {
		return map[string]any{"error": fmt.Sprintf("probe did not finish within %s: %v", probeTimeout, err)}
	}
	out := map[string]any{}
	healthy := true
	for _, h := range o.runtime.Hooks() {
		if h.Kind != causes.KindProbe {
			continue
		}
		done := make(chan outcome, 1)
		t0 := time.Now()
		go func() {
			// kopf gives probes (all activities) the indexes: a probe can report
			// what the index handlers collected.
			res, err := o.runtime.Invoke(ctx, causes.Call{Handler: h, Started: time.Now(), Logger: o.log.With("handler", h.ID, "reason", "probe"),
				Indexes: o.reactor.Indexes()})
			done <- outcome{res, err}
		}()
		failed := true
		select {
		case r := <-done:
			switch {
			case r.err != nil && ctx.Err() != nil:
				out[h.ID] = late(r.err)
			case r.err != nil:
				out[h.ID] = map[string]any{"error": r.err.Error()}
			default:
				out[h.ID], failed = r.res.Value, false
			}
		case <-ctx.Done():
			out[h.ID] = late(ctx.Err())
		}
		healthy = healthy && !failed
		fields := []any{"handler", h.ID, "reason", "probe", "took_ms", float64(time.Since(t0).Microseconds()) / 1000}
		if failed {
			o.log.Warn("handler failed; the liveness probe fails", append(fields, "error", out[h.ID].(map[string]any)["error"])...)
		} else {
			// At debug level: the kubelet probes every few seconds.
			o.log.Debug("handler succeeded", fields...)
		}
	}
	return out, healthy
}
