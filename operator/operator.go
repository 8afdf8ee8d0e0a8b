// Package operator assembles a running operator: the Lua runtime (luabind) loaded
// from a scripts folder, and the processing core (processing) watching the resources
// the scripts registered for. cmd/luaop and the test harness both start operators
// through it, so tests run exactly what users run.
package operator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/eventing"
	"github.com/luaop/luaop/kubeclient"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
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
}

// Operator is one running operator.
type Operator struct {
	opts    Options
	cfg     *rest.Config
	runtime *luabind.Runtime
	proc    *processing.Operator
	log     *slog.Logger
	loaded  atomic.Bool
	// stopEvents shuts down the Events recorder New made (a no-op if it made none).
	stopEvents func()
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
	if opts.Runtime.Kube == nil {
		kube, err := kubeclient.New(cfg)
		if err != nil {
			stopEvents()
			return nil, fmt.Errorf("creating the scripts' cluster client: %w", err)
		}
		if post {
			kube.Recorder = opts.Processing.Recorder
		}
		opts.Runtime.Kube = kube
	}
	rt := luabind.New(opts.Runtime)
	proc, err := processing.New(cfg, rt, opts.Processing)
	if err != nil {
		rt.Close()
		stopEvents()
		return nil, err
	}
	return &Operator{opts: opts, cfg: cfg, runtime: rt, proc: proc, log: opts.Logger, stopEvents: stopEvents}, nil
}

// Runtime gives access to the loaded scripts (reloads, hooks, live views).
func (o *Operator) Runtime() *luabind.Runtime { return o.runtime }

// Processing gives access to the processing core.
func (o *Operator) Processing() *processing.Operator { return o.proc }

// Ready tells whether the scripts are loaded and the initial listing is processed.
func (o *Operator) Ready() bool { return o.loaded.Load() && o.proc.Synced() }

// Load (re)reads the scripts and makes them current if they all load; otherwise the
// previous ones keep serving and the error, with file:line, is returned.
func (o *Operator) Load(ctx context.Context) (luabind.LoadReport, error) {
	scripts := o.opts.Scripts
	if scripts == nil {
		var err error
		if scripts, err = luabind.ReadDir(o.opts.ScriptsDir); err != nil {
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
	o.proc.Refresh()
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
		o.log.Info("scripts loaded", "files", len(report.Files), "handlers", len(report.Handlers), "took", report.Took)
		for _, h := range report.Handlers {
			o.log.Debug("handler", "id", h.ID, "kind", string(h.Kind), "resource", h.Resource.String(), "at", h.Source)
		}
	}
	if err := o.runHooks(ctx, "startup"); err != nil {
		return fmt.Errorf("%w; the operator does not start: fix the startup handler, or what it checks", err)
	}
	err := o.proc.Start(ctx)
	// Cleanup runs after the last cycle, with a fresh deadline of its own.
	cleanupCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if cerr := o.runHooks(cleanupCtx, "cleanup"); cerr != nil {
		o.log.Error("cleanup handler failed", "error", cerr)
	}
	return err
}

// runHooks runs the operator-level handlers of one kind (startup, cleanup) in
// registration order; the first failure stops the run.
func (o *Operator) runHooks(ctx context.Context, kind string) error {
	for _, h := range o.runtime.Hooks() {
		if string(h.Kind) != kind {
			continue
		}
		o.log.Info("running "+kind+" handler", "handler", h.ID)
		if _, err := o.runtime.Invoke(ctx, causes.Call{Handler: h, Started: time.Now(), Logger: o.log.With("handler", h.ID)}); err != nil {
			return fmt.Errorf("%s handler %s failed: %w", kind, h.ID, err)
		}
	}
	return nil
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
func (o *Operator) Probe(ctx context.Context) (map[string]any, bool) {
	const probeTimeout = 800 * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
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
		if h.Kind != "probe" {
			continue
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := o.runtime.Invoke(ctx, causes.Call{Handler: h, Started: time.Now(), Logger: o.log.With("handler", h.ID)})
			done <- outcome{res, err}
		}()
		select {
		case r := <-done:
			switch {
			case r.err != nil && ctx.Err() != nil:
				out[h.ID], healthy = late(r.err), false
			case r.err != nil:
				out[h.ID], healthy = map[string]any{"error": r.err.Error()}, false
			default:
				out[h.ID] = r.res.Value
			}
		case <-ctx.Done():
			out[h.ID], healthy = late(ctx.Err()), false
		}
	}
	return out, healthy
}
