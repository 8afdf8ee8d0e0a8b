package scriptwatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptsource"
)

// Defaults of [WatcherOptions].
const (
	// 20 ms (webpack's watcher waits as long): an editor's save (write, or write a
	// temporary and rename) and a ConfigMap's ..data swap make their events within a
	// few ms, and a reload should be live well under 50 ms after the save. A read
	// that still catches a file half written fails to load or loads what was there;
	// the writer's next event reloads the whole file. --reload-debounce raises it.
	DefaultDebounce     = 20 * time.Millisecond
	DefaultPollInterval = 2 * time.Second
)

// maxWaitFactor bounds a burst: a folder that never goes quiet for Debounce (a log file
// written every few milliseconds) is still re-read every maxWaitFactor*Debounce, so
// reloads are never starved. Editor saves and ConfigMap swaps end far sooner.
const maxWaitFactor = 10

// minMaxWait is the least time a burst may last before the folder is read anyway: a
// long copy (a git checkout, kubectl cp) is read half done less often.
const minMaxWait = 300 * time.Millisecond

// WatcherOptions configures [Watch]. The zero value gives the defaults.
type WatcherOptions struct {
	// Debounce is the quiet time that ends a burst of events; default 20ms.
	Debounce time.Duration
	// PollInterval is the period of the polling fallback, used when fsnotify cannot
	// be set up (inotify limits, file systems without events) or when ForcePolling is
	// set; default 2s. With fsnotify it is also the delay before a failed read is
	// retried when no further event arrives.
	PollInterval time.Duration
	// ForcePolling disables fsnotify and polls every PollInterval.
	ForcePolling bool
	// Logger receives read errors, watch errors and the switch to polling; default
	// slog.Default().
	Logger *slog.Logger
}

func (o WatcherOptions) withDefaults() WatcherOptions {
	if o.Debounce <= 0 {
		o.Debounce = DefaultDebounce
	}
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Change is one settled change of the scripts folder.
type Change struct {
	// Scripts is the complete new script set, read after the burst settled.
	Scripts []luabind.Script
	// Hash is the hex sha256 over the names and contents of Scripts: changes are
	// decided on content, not on timestamps.
	Hash string
	// Files names the scripts added, changed or removed compared to the previous set,
	// sorted. It is empty in the initial Change.
	Files []string
	// At is when the first event of the burst arrived (in polling mode: the poll that
	// saw the change), to measure reload latency. In the initial Change it is the
	// time of the initial read. For a change read through the API, when the watch
	// delivered it.
	At time.Time
	// ResourceVersion is the ConfigMap's, for a change read through the API
	// ([ConfigMapSource]); "" for the folder's.
	ResourceVersion string
	// Keys are all the keys of the ConfigMap (data and binaryData, sorted), for a
	// change read through the API: what its volume would hold.
	Keys []string
}

// Watch watches the scripts folder dir recursively (its subfolders too, and folders
// created later) and sends a Change on the returned channel once per burst of events
// whose settled content differs from the last Change sent (or from the initial
// content).
//
// Every event, whatever its name, starts or extends a burst; when no event arrived for
// Debounce, the whole set is re-read with [scriptsource.ReadDir] and its hash compared, so
// swap, backup and hidden files never cause a Change by themselves while a ConfigMap's
// ..data swap does. A burst that never goes quiet is read at least every 10*Debounce (300 ms at least).
//
// Watch reads the initial set itself and returns it as initial (Scripts, Hash, At); it
// is not sent on the channel. A consumer that falls behind gets one Change that
// covers everything since the last one it received. Errors reading files during a
// burst are logged and the read is retried on the next event, poll or after
// PollInterval. The channel is closed, and every goroutine of the watcher has ended,
// when ctx is done.
func Watch(ctx context.Context, dir string, opts WatcherOptions) (initial Change, changes <-chan Change, err error) {
	return watch(ctx, dir, opts, fsnotify.NewWatcher)
}

// watch is Watch with the fsnotify constructor as a parameter, so tests can make it
// fail and check the polling fallback.
func watch(ctx context.Context, dir string, opts WatcherOptions, newNotifier func() (*fsnotify.Watcher, error)) (Change, <-chan Change, error) {
	opts = opts.withDefaults()
	dir = filepath.Clean(dir)
	if fi, err := os.Stat(dir); err != nil {
		return Change{}, nil, fmt.Errorf("watching scripts: %w", err)
	} else if !fi.IsDir() {
		return Change{}, nil, fmt.Errorf("watching scripts: %s is not a folder", dir)
	}
	w := &watcher{dir: dir, opts: opts, log: opts.Logger.With("dir", dir), extra: map[string]struct{}{}}
	if !opts.ForcePolling {
		// Watches first, then the initial read: nothing changed in between is missed.
		if err := w.startNotify(newNotifier); err != nil {
			w.log.Warn("file events unavailable, polling instead",
				"error", err, "interval", opts.PollInterval)
		}
	}
	tree, err := w.files.ReadTree(dir)
	if err != nil {
		w.stopNotify()
		return Change{}, nil, fmt.Errorf("reading scripts: %w", err)
	}
	scripts := tree.Scripts
	initial := Change{Scripts: scripts, Hash: HashScripts(scripts), At: time.Now()}
	out := make(chan Change)
	go w.run(ctx, initial, out)
	return initial, out, nil
}

// watcher is the state of one Watch; it is owned by the run goroutine once started.
type watcher struct {
	dir   string
	opts  WatcherOptions
	log   *slog.Logger
	fsw   *fsnotify.Watcher   // nil when polling
	extra map[string]struct{} // folders outside dir holding targets of script symlinks
	// files keeps what the last read read, so a read opens only the files that
	// changed since; not used while polling (file systems without events are often
	// network ones, whose stat may answer from a cache).
	files scriptsource.FileCache
}

func (w *watcher) startNotify(newNotifier func() (*fsnotify.Watcher, error)) error {
	fsw, err := newNotifier()
	if err != nil {
		return err
	}
	w.fsw = fsw
	if err := w.syncWatches(); err != nil {
		w.stopNotify()
		return err
	}
	return nil
}

func (w *watcher) stopNotify() {
	if w.fsw != nil {
		_ = w.fsw.Close() // waits for fsnotify's reader goroutine to end
		w.fsw = nil
	}
}

// addDirs watches root and every folder below it that is not hidden or an editor
// leftover (the folders scriptsource.ReadDir reads). Adding is idempotent. Folders that
// vanish meanwhile are skipped; any other failure (inotify watch limit) is returned.
func (w *watcher) addDirs(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p != root && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if p != w.dir && scriptsource.IgnoredName(d.Name()) {
			return filepath.SkipDir
		}
		if err := w.fsw.Add(p); err != nil {
			if p != root && errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipDir
			}
			return fmt.Errorf("watching %s: %w", p, err)
		}
		return nil
	})
}

// syncWatches makes sure every folder of the tree is watched (the root may have been
// replaced, a watch lost to a rename) and that the folders holding the targets of
// script symlinks pointing outside the tree are watched too: their writes give no
// event inside the tree.
func (w *watcher) syncWatches() error {
	if err := w.addDirs(w.dir); err != nil {
		return err
	}
	var links []string
	_ = filepath.WalkDir(w.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if p != w.dir && scriptsource.IgnoredName(d.Name()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 && strings.HasSuffix(d.Name(), ".lua") {
			links = append(links, p)
		}
		return nil
	})
	return w.watchLinkTargets(links)
}

// syncTree is syncWatches from what a read found (the same walk): no walk of its own.
func (w *watcher) syncTree(t scriptsource.Tree) error {
	for _, d := range t.Dirs {
		if err := w.fsw.Add(d); err != nil {
			if d != w.dir && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("watching %s: %w", d, err)
		}
	}
	return w.watchLinkTargets(t.Links)
}

// watchLinkTargets watches the folders outside the tree that hold the targets of the
// script symlinks links, and stops watching those no longer needed.
func (w *watcher) watchLinkTargets(links []string) error {
	rootReal, err := filepath.EvalSymlinks(w.dir)
	if err != nil {
		return nil // the folder is gone; the read fails and is retried
	}
	want := map[string]struct{}{}
	for _, p := range links {
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue
		}
		if td := filepath.Dir(target); !within(rootReal, td) {
			want[td] = struct{}{}
		}
	}
	for td := range want {
		if err := w.fsw.Add(td); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("watching %s: %w", td, err)
		}
	}
	for td := range w.extra {
		if _, ok := want[td]; !ok {
			_ = w.fsw.Remove(td)
		}
	}
	w.extra = want
	return nil
}

// within tells whether p is root or below it.
func within(root, p string) bool {
	return p == root || strings.HasPrefix(p, root+string(filepath.Separator))
}

// handleEvent keeps the watches in step with the tree: new folders get a watch (with
// everything already below them), and a removed or renamed path loses its watch so a
// folder created later under that name gets a fresh one.
func (w *watcher) handleEvent(ev fsnotify.Event) error {
	if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
		_ = w.fsw.Remove(ev.Name) // not watched: ErrNonExistentWatch, ignored
	}
	if !ev.Has(fsnotify.Create) || !within(w.dir, ev.Name) || scriptsource.IgnoredName(filepath.Base(ev.Name)) {
		return nil
	}
	fi, err := os.Lstat(ev.Name)
	if err != nil || !fi.IsDir() {
		return nil
	}
	return w.addDirs(ev.Name)
}

// fallBack switches to polling for good after a watch could not be added.
func (w *watcher) fallBack(b *runState, err error) {
	w.log.Warn("file events failed, polling instead", "error", err, "interval", w.opts.PollInterval)
	w.stopNotify()
	b.startPolling(w.opts.PollInterval)
}

// runState is the run goroutine's state between the folder's events and the Change
// the consumer takes.
type runState struct {
	last        Change    // what the consumer has: the last Change it took, or the initial read
	pending     *Change   // settled change not yet taken by the consumer
	at          time.Time // first event since the last successful read
	windowStart time.Time // first event of the current debounce window
	maxWait     time.Duration
	settle      *time.Timer
	poll        *time.Ticker // nil until polling
}

func (b *runState) startPolling(interval time.Duration) {
	if b.poll == nil {
		b.poll = time.NewTicker(interval)
	}
}

// polls is the polling ticker's channel, nil (never ready) while not polling.
func (b *runState) polls() <-chan time.Time {
	if b.poll == nil {
		return nil
	}
	return b.poll.C
}

func (b *runState) stop() {
	b.settle.Stop()
	if b.poll != nil {
		b.poll.Stop()
	}
}

// event starts or extends a burst.
func (b *runState) event(now time.Time, debounce time.Duration) {
	if b.at.IsZero() {
		b.at = now
	}
	if b.windowStart.IsZero() {
		b.windowStart = now
	}
	d := min(debounce, max(b.windowStart.Add(b.maxWait).Sub(now), 0))
	b.settle.Reset(d)
}

func (w *watcher) run(ctx context.Context, last Change, out chan<- Change) {
	defer close(out)     // runs last: a closed channel means everything has ended
	defer w.stopNotify() // runs first

	b := &runState{last: last, maxWait: max(maxWaitFactor*w.opts.Debounce, minMaxWait), settle: time.NewTimer(time.Hour)}
	b.settle.Stop()
	defer b.stop()
	if w.fsw == nil {
		b.startPolling(w.opts.PollInterval)
	}
	for {
		var (
			events <-chan fsnotify.Event
			errs   <-chan error
			outC   chan<- Change
			next   Change
		)
		if w.fsw != nil {
			events, errs = w.fsw.Events, w.fsw.Errors
		}
		if b.pending != nil {
			outC, next = out, *b.pending
		}
		select {
		case <-ctx.Done():
			return
		case outC <- next:
			b.last, b.pending = next, nil
		case ev, ok := <-events:
			if !ok {
				w.fallBack(b, errors.New("fsnotify event channel closed"))
				continue
			}
			if err := w.handleEvent(ev); err != nil {
				w.fallBack(b, err)
			}
			b.event(time.Now(), w.opts.Debounce)
		case err, ok := <-errs:
			if !ok {
				continue // the events case handles the close
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				b.event(time.Now(), w.opts.Debounce) // events were lost: re-read to be sure
				continue
			}
			w.log.Warn("file watch error", "error", err)
		case <-b.settle.C:
			if !w.read(b) && w.fsw != nil {
				b.settle.Reset(w.opts.PollInterval) // retried sooner if another event comes
			}
		case now := <-b.polls():
			if b.at.IsZero() {
				b.at = now
			}
			w.read(b)
		}
	}
}

// read re-reads the set and updates the pending change; it reports whether it
// succeeded.
func (w *watcher) read(b *runState) bool {
	b.windowStart = time.Time{}
	cache := &w.files
	if w.fsw == nil {
		cache = nil
	}
	tree, err := cache.ReadTree(w.dir)
	if err != nil {
		w.log.Warn("reading scripts failed, will retry", "error", err)
		return false
	}
	scripts := tree.Scripts
	if w.fsw != nil {
		if err := w.syncTree(tree); err != nil {
			w.fallBack(b, err)
		}
	}
	first := b.at
	b.at = time.Time{}
	h := HashScripts(scripts)
	switch {
	case h == b.last.Hash:
		b.pending = nil // back to what the consumer has (or nothing changed)
	case b.pending != nil && h == b.pending.Hash:
		// unchanged since the pending change was made
	default:
		if b.pending != nil {
			first = b.pending.At
		}
		b.pending = &Change{Scripts: scripts, Hash: h, Files: DiffScripts(b.last.Scripts, scripts), At: first}
		w.log.Debug("scripts changed", "files", b.pending.Files)
	}
	return true
}

// HashScripts returns the hex sha256 over the names and contents of scripts, each
// length-prefixed so that no two different sets share an encoding. The folder's
// changes and the ConfigMap's are hashed alike, so that the same scripts read from
// either have the same hash (reloading tells them apart by it).
func HashScripts(scripts []luabind.Script) string {
	h := sha256.New()
	var n [8]byte
	for _, s := range scripts {
		binary.BigEndian.PutUint64(n[:], uint64(len(s.Name)))
		h.Write(n[:])
		h.Write([]byte(s.Name))
		binary.BigEndian.PutUint64(n[:], uint64(len(s.Source)))
		h.Write(n[:])
		h.Write(s.Source)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// DiffScripts returns the sorted names added, changed or removed between two sets
// sorted by name (as scriptsource.ReadDir and ScriptsOfConfigMap return them).
func DiffScripts(old, cur []luabind.Script) []string {
	var files []string
	i, j := 0, 0
	for i < len(old) || j < len(cur) {
		switch {
		case j == len(cur) || (i < len(old) && old[i].Name < cur[j].Name):
			files = append(files, old[i].Name) // removed
			i++
		case i == len(old) || cur[j].Name < old[i].Name:
			files = append(files, cur[j].Name) // added
			j++
		default:
			if !bytes.Equal(old[i].Source, cur[j].Source) {
				files = append(files, cur[j].Name)
			}
			i++
			j++
		}
	}
	return files
}
