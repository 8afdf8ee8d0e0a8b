package reloading

import (
	"context"
	"log/slog"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptwatch"
)

// Operator is what a reload makes current; *operator.Operator is one.
type Operator interface {
	// LoadScripts makes a script set current atomically (the runtime's swap, then
	// a cycle for every object so that daemons and timers follow the new
	// handlers: the reactor's refresh); on an error (file:line) nothing changed.
	LoadScripts(ctx context.Context, scripts []luabind.Script) (luabind.LoadReport, error)
	// NoteReload records the outcome of a load of the folder, for /readyz and
	// /debug.
	NoteReload(files []string, err error)
	// NoteLastGood records whether the scripts serving are the last good ones
	// kept by the operator rather than the folder's.
	NoteLastGood(serving bool)
}

// Metrics counts the loads; *metrics.Metrics is one.
type Metrics interface {
	// Reload counts a load of the folder and sets the failed gauge.
	Reload(ok bool)
	// ReloadLatency observes a reload's time from the save to the new handlers
	// active (Event.Latency).
	ReloadLatency(ok bool, d time.Duration)
}

// Follower follows the handlers: told after each load that made new scripts
// current. *admission.Webhooks is one (its configurations follow the admission
// handlers); so is peering's scope (the resources served).
type Follower interface{ Resync() }

// View shows the loads to a person (`luaop dev`'s terminal view, devloop).
type View interface {
	// Loaded shows the first scripts to serve, in full.
	Loaded(dir string, report luabind.LoadReport)
	// Reloaded shows one load of the folder that was not the first to serve: its
	// error (file:line), or the reload that made a save current.
	Reloaded(ev Event)
}

// LastGood keeps the last scripts that loaded where a restart finds them;
// *LastGoodStore is one (a ConfigMap).
type LastGood interface {
	// Keep offers scripts that just loaded; it must not wait for their writing.
	Keep(scripts []luabind.Script, hash string)
	// Load reads the kept scripts: nil, nil when none are kept yet.
	Load(ctx context.Context) ([]luabind.Script, error)
	// Name says where they are kept, for messages.
	Name() string
}

// Options configure a [Reloader]. Only Operator is required; a nil field is a
// part the process does not have.
type Options struct {
	// Dir is the scripts folder Watch follows and messages name.
	Dir string
	// Debounce is the watcher's quiet time (scriptwatch.WatcherOptions.Debounce);
	// 0: scriptwatch.DefaultDebounce (20ms).
	Debounce time.Duration
	// Operator loads the scripts. Required.
	Operator Operator
	// Metrics counts every load of the folder (the first one included) and
	// observes the latency of every reload from a save (the first load is from
	// no save: it has none). Default: none.
	Metrics Metrics
	// Webhooks are resynced after each reload that made new scripts current, but
	// not after the first scripts to serve (First): the webhook server starts
	// after them and syncs its configurations when it starts. Default: none.
	Webhooks Follower
	// Peering's scope is resynced after every load that made scripts current, the
	// first included (the peer starts after it). Default: none.
	Peering Follower
	// API is the scripts ConfigMap read through the API server (luaop run
	// --scripts-configmap, unless --scripts-from-api=false): a second source of the
	// scripts, which brings an edit in as soon as it is applied, where the folder
	// (the kubelet's copy) brings it about a minute later. The folder is the first
	// source (the pod started with it); the API is followed only when the folder is
	// that ConfigMap alone. Each content is loaded once, whichever source brings it
	// first, and an older content never replaces a newer one (resourceVersions,
	// [versions]). Default: none (the folder alone).
	API API
	// LastGood keeps each set that loaded from the folder, and serves what it
	// kept when the folder's first load fails. Default: none (a first load that
	// fails then waits, unready, for the fix).
	LastGood LastGood
	// View shows every outcome (and the log then does not repeat them); nil: the
	// outcomes are logged (luaop run).
	View View
	// Logger is the log; default slog.Default().
	Logger *slog.Logger
}

// Event is one load of the scripts after a save of the folder or an edit of the
// ConfigMap.
type Event struct {
	// Files changed since the previous content.
	Files []string
	// ResourceVersion is the scripts ConfigMap's at the content loaded, when the
	// API told it (a change read through the API, or a folder's placed by its
	// hash); FromAPI: the change was read through the API (not the folder).
	ResourceVersion string
	FromAPI         bool
	Report          luabind.LoadReport
	// Err is the load's error (file:line); the previous scripts keep serving.
	Err error
	// NothingServes: no scripts serve yet (the first load failed, and none has
	// loaded since), so an error has no previous scripts behind it.
	NothingServes bool
	// Latency runs from the first file event of the burst to the new handlers being
	// active (the swap at the end of Report.Took), or the error being known.
	Latency time.Duration
	// Total runs from the first file event to the loader's return: Latency plus what
	// the loader does after the swap (the operator schedules a cycle for every
	// object, so that daemons and timers follow the new handlers).
	Total time.Duration
}

// Reloader owns the reload: it reads the scripts folder (scriptwatch), loads each
// settled change into the operator, and does everything that follows a load (the
// last good scripts, the metrics, the webhooks, peering's scope, the operator's
// notes and the view or the log), the same way for the first load and for every
// reload, in `luaop run` and `luaop dev` alike.
//
// Its state is owned by one goroutine at a time: the caller of Watch and First,
// then the one goroutine running Run (handed over by the go statement); never call
// them concurrently. It holds no lock, so none is held while it calls out.
type Reloader struct {
	opts    Options
	log     *slog.Logger
	initial scriptwatch.Change
	changes <-chan scriptwatch.Change // the folder's
	// api is the API's changes (nil without, or once the folder turned out not
	// to be the ConfigMap alone); stopAPI ends its watch.
	api     <-chan scriptwatch.Change
	stopAPI context.CancelFunc
	// tried is the content last loaded or tried, from either source: a change
	// with the same hash loads nothing (exactly one reload per content).
	tried    scriptwatch.Change
	versions versions
}

// New makes a Reloader of opts.
func New(opts Options) *Reloader {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Reloader{opts: opts, log: opts.Logger}
}

// Watch starts following the folder (scriptwatch.Watch: the watches before the
// first read, so that no save in between is missed), and the ConfigMap through the
// API when Options.API is set, until ctx is done.
func (r *Reloader) Watch(ctx context.Context) error {
	initial, changes, err := scriptwatch.Watch(ctx, r.opts.Dir, scriptwatch.WatcherOptions{Logger: r.log, Debounce: r.opts.Debounce})
	if err != nil {
		return err
	}
	r.initial, r.changes, r.tried = initial, changes, initial
	if r.opts.API != nil {
		actx, cancel := context.WithCancel(ctx)
		r.api, r.stopAPI = r.opts.API.Watch(actx), cancel
	}
	return nil
}

// First loads the folder's first read. When it does not load, the last good
// scripts serve if kept; else First waits, loading each save, until scripts load.
// It reports whether scripts serve: false when ctx ended (or the watch did)
// before any did. The view, or the log, then shows the scripts serving in full.
func (r *Reloader) First(ctx context.Context) bool {
	r.tried = r.initial
	report, err := r.load(ctx, r.initial.Scripts, r.initial.Files)
	if err != nil {
		r.firstFailed(r.initial.Files, err)
		if rep, ok := r.serveLastGood(ctx); ok {
			report, err = rep, nil
		} else if r.opts.View == nil {
			r.log.Error("no last good scripts to serve: the operator stays up, unready, and loads the scripts as soon as they are fixed", "dir", r.opts.Dir)
		}
	}
	for err != nil {
		ev, ok := r.next(ctx)
		if !ok {
			return false
		}
		if ev.Err != nil {
			if r.opts.View != nil {
				ev.NothingServes = true
				r.opts.View.Reloaded(ev)
			} else {
				r.log.Error("reload failed; still no scripts serving", "files", ev.Files, "error", ev.Err, "resourceVersion", ev.ResourceVersion)
			}
		}
		report, err = ev.Report, ev.Err
	}
	if r.opts.Peering != nil {
		r.opts.Peering.Resync()
	}
	if r.opts.View != nil {
		r.opts.View.Loaded(r.opts.Dir, report)
	} else {
		r.log.Info("scripts loaded", "files", len(report.Files), "handlers", len(report.Handlers), "hash", report.Hash)
	}
	return true
}

// firstFailed tells that the folder's first read does not load.
func (r *Reloader) firstFailed(files []string, err error) {
	if r.opts.View != nil {
		// In development a broken first load waits for the fix; the view says so.
		r.opts.View.Reloaded(Event{Files: files, Err: err, NothingServes: r.opts.LastGood == nil})
		return
	}
	// No crash loop on broken scripts: serve the last good ones if kept, else
	// wait, unready, for the fixed scripts. The gauge, /readyz and /debug say
	// that the scripts serving are not the folder's.
	r.log.Error("the scripts do not load", "dir", r.opts.Dir, "error", err)
}

// serveLastGood loads the last good scripts kept, when the folder's first read
// does not load.
func (r *Reloader) serveLastGood(ctx context.Context) (luabind.LoadReport, bool) {
	store := r.opts.LastGood
	if store == nil {
		return luabind.LoadReport{}, false
	}
	scripts, err := store.Load(ctx)
	if err != nil {
		r.log.Error("the last good scripts cannot be read", "error", err)
		return luabind.LoadReport{}, false
	}
	if scripts == nil {
		return luabind.LoadReport{}, false
	}
	rep, err := r.opts.Operator.LoadScripts(ctx, scripts)
	if err != nil {
		r.log.Error("the last good scripts do not load either", "configmap", store.Name(), "error", err)
		return luabind.LoadReport{}, false
	}
	r.opts.Operator.NoteLastGood(true)
	r.log.Warn("serving the last good scripts: the mounted ones do not load; fix them and they are loaded without a restart",
		"configmap", store.Name(), "hash", rep.Hash, "handlers", len(rep.Handlers))
	return rep, true
}

// Run loads every change of the folder, and of the ConfigMap through the API,
// after the first load (First's, or the caller's own) until ctx is done (or the
// folder's watch ended), one at a time: a change saved while one is being applied
// waits for it (each source folds the changes meanwhile into one). A broken edit
// never stops it: the previous scripts keep serving, and the next save is tried.
func (r *Reloader) Run(ctx context.Context) {
	for {
		ev, ok := r.next(ctx)
		if !ok {
			return
		}
		if ev.Err == nil && r.opts.Webhooks != nil {
			r.opts.Webhooks.Resync() // the configurations follow the handlers
		}
		if ev.Err == nil && r.opts.Peering != nil {
			r.opts.Peering.Resync() // the resources served follow them too
		}
		r.reloaded(ev)
	}
}

// next waits for the next change to load, from either source, and loads it; false
// when ctx ended or the folder's watch did.
func (r *Reloader) next(ctx context.Context) (Event, bool) {
	for {
		select {
		case <-ctx.Done():
			return Event{}, false
		case ch, ok := <-r.changes:
			if !ok {
				return Event{}, false
			}
			if ch, load, fromAPI := r.fromFolder(ctx, ch); load {
				ev := r.reload(ctx, ch)
				ev.FromAPI = fromAPI
				return ev, true
			}
		case ch, ok := <-r.api:
			if !ok {
				r.api = nil // ended with ctx
				continue
			}
			if r.fromAPI(ch) {
				ev := r.reload(ctx, ch)
				ev.FromAPI = true
				return ev, true
			}
		}
	}
}

// reloaded shows a reload after the first scripts served.
func (r *Reloader) reloaded(ev Event) {
	switch {
	case r.opts.View != nil:
		r.opts.View.Reloaded(ev)
	case ev.Err != nil:
		r.log.Error("reload failed; the previous scripts keep running", "files", ev.Files, "error", ev.Err, "latency_ms", millis(ev.Latency),
			"source", ev.source(r.opts), "resourceVersion", ev.ResourceVersion)
	default:
		// latency_ms: from the save (first file event) to the new handlers
		// active; load_ms: the load alone; total_ms: to every object scheduled
		// for a cycle; compiled: the files compiled (the others were unchanged);
		// source: the folder or the ConfigMap (through the API).
		r.log.Info("scripts reloaded", "files", ev.Files, "handlers", len(ev.Report.Handlers), "hash", ev.Report.Hash,
			"latency_ms", millis(ev.Latency), "load_ms", millis(ev.Report.Took), "total_ms", millis(ev.Total),
			"compiled", len(ev.Report.Compiled), "source", ev.source(r.opts), "resourceVersion", ev.ResourceVersion)
	}
}

// source names where an event's change was read, for the log.
func (ev Event) source(opts Options) string {
	if ev.FromAPI {
		return "configmap " + opts.API.Name()
	}
	return "folder " + opts.Dir
}

// reload loads one change, from either source, timed from its save, and observes
// the latency. The files changed are those since the content last tried (the
// sources' own diffs do not know what the other brought).
func (r *Reloader) reload(ctx context.Context, ch scriptwatch.Change) Event {
	ch.Files = scriptwatch.DiffScripts(r.tried.Scripts, ch.Scripts)
	r.tried = ch
	start := time.Now()
	rep, err := r.load(ctx, ch.Scripts, ch.Files)
	total := time.Since(ch.At)
	latency := total
	if err == nil && rep.Took > 0 {
		latency = min(start.Sub(ch.At)+rep.Took, total)
	}
	if r.opts.Metrics != nil {
		r.opts.Metrics.ReloadLatency(err == nil, latency)
	}
	return Event{Files: ch.Files, ResourceVersion: ch.ResourceVersion, Report: rep, Err: err, Latency: latency, Total: total}
}

// load loads a read of the folder and keeps the books every load of it keeps:
// the last good scripts, the count, the operator's notes.
func (r *Reloader) load(ctx context.Context, scripts []luabind.Script, files []string) (luabind.LoadReport, error) {
	rep, err := r.opts.Operator.LoadScripts(ctx, scripts)
	if err == nil {
		r.opts.Operator.NoteLastGood(false) // the folder's scripts serve again
		if r.opts.LastGood != nil {
			r.opts.LastGood.Keep(scripts, rep.Hash)
		}
	}
	if r.opts.Metrics != nil {
		r.opts.Metrics.Reload(err == nil)
	}
	r.opts.Operator.NoteReload(files, err)
	return rep, err
}

// millis is a duration in milliseconds with microsecond precision, for log fields
// named *_ms: a number in JSON, unlike a time.Duration (integer nanoseconds).
func millis(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
