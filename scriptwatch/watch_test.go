package scriptwatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptsource"
)

const (
	testDebounce   = DefaultDebounce
	changeDeadline = 5 * time.Second // generous: -race on a busy machine
)

// writeFile writes name (slash separated, relative to dir), creating its folders.
func writeFile(t testing.TB, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startWatch starts a watcher that is stopped when the test ends; the cleanup checks
// that the channel gets closed, which happens only after all its goroutines ended.
func startWatch(t testing.TB, dir string, opts WatcherOptions) (Change, <-chan Change) {
	t.Helper()
	return startWith(t, dir, opts, fsnotify.NewWatcher)
}

func startWith(t testing.TB, dir string, opts WatcherOptions, newNotifier func() (*fsnotify.Watcher, error)) (Change, <-chan Change) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	ctx, cancel := context.WithCancel(t.Context())
	initial, ch, err := watch(ctx, dir, opts, newNotifier)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		waitClosed(t, ch)
	})
	return initial, ch
}

func waitClosed(t testing.TB, ch <-chan Change) {
	t.Helper()
	deadline := time.After(changeDeadline)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("changes channel not closed after cancel")
		}
	}
}

func expectChange(t testing.TB, ch <-chan Change) Change {
	t.Helper()
	select {
	case c, ok := <-ch:
		if !ok {
			t.Fatal("channel closed, want a change")
		}
		return c
	case <-time.After(changeDeadline):
		t.Fatalf("no change within %v", changeDeadline)
	}
	return Change{}
}

// expectNoChangeBefore is the barrier of a negative check: it saves a sentinel script
// and expects the next change to name only it (a change the test's earlier action
// caused would come first, or be merged into the sentinel's), then removes it again
// (a second change naming only it). No fixed window: the watcher reports the earlier
// action before or with the sentinel, however slow the machine.
func expectNoChangeBefore(t testing.TB, dir string, ch <-chan Change) {
	t.Helper()
	const sentinel = "zz-barrier.lua"
	writeFile(t, dir, sentinel, "return 'barrier'")
	if c := expectChange(t, ch); !slices.Equal(c.Files, []string{sentinel}) {
		t.Fatalf("a change before the barrier: files %v, want only %s", c.Files, sentinel)
	}
	must(t, os.Remove(filepath.Join(dir, sentinel)))
	if c := expectChange(t, ch); !slices.Equal(c.Files, []string{sentinel}) {
		t.Fatalf("removing the barrier: files %v, want only %s", c.Files, sentinel)
	}
}

func scriptMap(scripts []luabind.Script) map[string]string {
	m := map[string]string{}
	for _, s := range scripts {
		m[s.Name] = string(s.Source)
	}
	return m
}

func checkScripts(t testing.TB, got []luabind.Script, want map[string]string) {
	t.Helper()
	if g := scriptMap(got); !mapsEqual(g, want) {
		t.Fatalf("scripts = %v, want %v", g, want)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// burst is one group of file operations done without pause, and its expected outcome.
type burst struct {
	do    func(t *testing.T, dir string)
	files []string          // the Change's Files; nil: no Change may arrive
	want  map[string]string // the complete script set of the Change
}

// plainWrite is a follow-up burst showing that the watcher is still alive after a
// burst that had to give no change.
func plainWrite(initial map[string]string) burst {
	want := map[string]string{}
	for k, v := range initial {
		want[k] = v
	}
	want["widgets.lua"] = "return 'after'"
	return burst{
		do:    func(t *testing.T, dir string) { writeFile(t, dir, "widgets.lua", "return 'after'") },
		files: []string{"widgets.lua"},
		want:  want,
	}
}

// configMap builds a ConfigMap volume as the kubelet does: the data in a timestamped
// folder, ..data linking to it, and each key a link to ..data/<key>.
func configMap(t *testing.T, dir, ts string, data map[string]string) {
	for k, v := range data {
		writeFile(t, dir, ts+"/"+k, v)
	}
	must(t, os.Symlink(ts, filepath.Join(dir, "..data")))
	for k := range data {
		must(t, os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)))
	}
}

// configMapUpdate is the kubelet's atomic update: new timestamped folder, ..data_tmp
// link to it renamed over ..data, old folder removed, then links for new keys.
func configMapUpdate(t *testing.T, dir, oldTS, newTS string, data map[string]string, newKeys ...string) {
	for k, v := range data {
		writeFile(t, dir, newTS+"/"+k, v)
	}
	must(t, os.Symlink(newTS, filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(t, os.RemoveAll(filepath.Join(dir, oldTS)))
	for _, k := range newKeys {
		must(t, os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)))
	}
}

func TestWatchBursts(t *testing.T) {
	base := map[string]string{"widgets.lua": "return 'v1'", "gadgets.lua": "return 'g1'"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	five := map[string]string{}
	for i := range 5 {
		five[fmt.Sprintf("s%d.lua", i)] = "return 0"
	}
	const (
		oldTS = "..2026_11_29_15_00_00.123"
		newTS = "..2026_11_29_15_01_00.456"
	)

	tests := []struct {
		name    string
		files   map[string]string              // initial plain files
		prepare func(t *testing.T, dir string) // other initial state
		initial map[string]string              // initial set if not files
		bursts  []burst
	}{
		{
			name:  "plain write",
			files: base,
			bursts: []burst{{
				do:    func(t *testing.T, dir string) { writeFile(t, dir, "widgets.lua", "return 'v2'") },
				files: []string{"widgets.lua"},
				want:  with("widgets.lua", "return 'v2'"),
			}},
		},
		{
			// vim with backupcopy=no: probe file 4913, new content written to a
			// temporary, the original renamed away as backup, the new file renamed in.
			name:  "vim save by rename",
			files: with(".widgets.lua.swp", "swap"),
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					writeFile(t, dir, "4913", "")
					must(t, os.Remove(filepath.Join(dir, "4913")))
					writeFile(t, dir, ".widgets.lua.new", "return 'vim'")
					must(t, os.Rename(filepath.Join(dir, "widgets.lua"), filepath.Join(dir, "widgets.lua~")))
					must(t, os.Rename(filepath.Join(dir, ".widgets.lua.new"), filepath.Join(dir, "widgets.lua")))
					must(t, os.Remove(filepath.Join(dir, "widgets.lua~")))
				},
				files: []string{"widgets.lua"},
				want:  with("widgets.lua", "return 'vim'"),
			}},
		},
		{
			name:  "jetbrains safe write",
			files: base,
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					writeFile(t, dir, "widgets.lua___jb_tmp___", "return 'jb'")
					must(t, os.Rename(filepath.Join(dir, "widgets.lua"), filepath.Join(dir, "widgets.lua___jb_old___")))
					must(t, os.Rename(filepath.Join(dir, "widgets.lua___jb_tmp___"), filepath.Join(dir, "widgets.lua")))
					must(t, os.Remove(filepath.Join(dir, "widgets.lua___jb_old___")))
				},
				files: []string{"widgets.lua"},
				want:  with("widgets.lua", "return 'jb'"),
			}},
		},
		{
			name:  "new file",
			files: base,
			bursts: []burst{{
				do:    func(t *testing.T, dir string) { writeFile(t, dir, "alpha.lua", "return 'a'") },
				files: []string{"alpha.lua"},
				want:  with("alpha.lua", "return 'a'"),
			}},
		},
		{
			name:  "deleted file",
			files: base,
			bursts: []burst{{
				do:    func(t *testing.T, dir string) { must(t, os.Remove(filepath.Join(dir, "gadgets.lua"))) },
				files: []string{"gadgets.lua"},
				want:  with("gadgets.lua", ""),
			}},
		},
		{
			// The second burst writes only inside the new folders: it is seen only if
			// they got watches.
			name:  "new file in new subfolder",
			files: base,
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					writeFile(t, dir, "lib/util.lua", "return 'u1'")
					writeFile(t, dir, "lib/deep/er/x.lua", "return 'x1'")
				},
				files: []string{"lib/deep/er/x.lua", "lib/util.lua"},
				want:  with("lib/util.lua", "return 'u1'", "lib/deep/er/x.lua", "return 'x1'"),
			}, {
				do:    func(t *testing.T, dir string) { writeFile(t, dir, "lib/deep/er/x.lua", "return 'x2'") },
				files: []string{"lib/deep/er/x.lua"},
				want:  with("lib/util.lua", "return 'u1'", "lib/deep/er/x.lua", "return 'x2'"),
			}, {
				do:    func(t *testing.T, dir string) { writeFile(t, dir, "lib/util.lua", "return 'u2'") },
				files: []string{"lib/util.lua"},
				want:  with("lib/util.lua", "return 'u2'", "lib/deep/er/x.lua", "return 'x2'"),
			}},
		},
		{
			name:  "burst of 20 writes to 5 files",
			files: five,
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					for i := range 20 {
						writeFile(t, dir, fmt.Sprintf("s%d.lua", i%5), fmt.Sprintf("return %d", i))
					}
				},
				files: []string{"s0.lua", "s1.lua", "s2.lua", "s3.lua", "s4.lua"},
				want: map[string]string{"s0.lua": "return 15", "s1.lua": "return 16", "s2.lua": "return 17",
					"s3.lua": "return 18", "s4.lua": "return 19"},
			}},
		},
		{
			name:  "touch without content change",
			files: base,
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					future := time.Now().Add(time.Hour)
					must(t, os.Chtimes(filepath.Join(dir, "widgets.lua"), future, future))
					writeFile(t, dir, "gadgets.lua", base["gadgets.lua"]) // same bytes again
				},
			}, plainWrite(base)},
		},
		{
			name:  "swap and backup files",
			files: base,
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					for _, n := range []string{".widgets.lua.swp", ".widgets.lua.swx", "widgets.lua~", "4913",
						"widgets.lua___jb_tmp___", "widgets.lua___jb_old___", ".#widgets.lua", "notes.txt"} {
						writeFile(t, dir, n, "return 'junk'")
					}
					writeFile(t, dir, ".hidden/x.lua", "return 'hidden'")
				},
			}, plainWrite(base)},
		},
		{
			name:  "changed and reverted within one burst",
			files: base,
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					writeFile(t, dir, "widgets.lua", "return 'tmp'")
					writeFile(t, dir, "widgets.lua", base["widgets.lua"])
				},
			}, plainWrite(base)},
		},
		{
			name: "configmap ..data swap",
			prepare: func(t *testing.T, dir string) {
				configMap(t, dir, oldTS, map[string]string{"widgets.lua": "return 'cm1'", "gadgets.lua": "return 'g1'"})
			},
			initial: map[string]string{"widgets.lua": "return 'cm1'", "gadgets.lua": "return 'g1'"},
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					configMapUpdate(t, dir, oldTS, newTS, map[string]string{"widgets.lua": "return 'cm2'", "gadgets.lua": "return 'g1'"})
				},
				files: []string{"widgets.lua"},
				want:  map[string]string{"widgets.lua": "return 'cm2'", "gadgets.lua": "return 'g1'"},
			}},
		},
		{
			name: "configmap ..data swap adding a key",
			prepare: func(t *testing.T, dir string) {
				configMap(t, dir, oldTS, map[string]string{"widgets.lua": "return 'cm1'"})
			},
			initial: map[string]string{"widgets.lua": "return 'cm1'"},
			bursts: []burst{{
				do: func(t *testing.T, dir string) {
					configMapUpdate(t, dir, oldTS, newTS,
						map[string]string{"widgets.lua": "return 'cm1'", "gadgets.lua": "return 'new'"}, "gadgets.lua")
				},
				files: []string{"gadgets.lua"},
				want:  map[string]string{"widgets.lua": "return 'cm1'", "gadgets.lua": "return 'new'"},
			}},
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for k, v := range tt.files {
				writeFile(t, dir, k, v)
			}
			if tt.prepare != nil {
				tt.prepare(t, dir)
			}
			wantInitial := tt.initial
			if wantInitial == nil {
				wantInitial = map[string]string{}
				for k, v := range tt.files {
					if !scriptsource.IgnoredName(k) {
						wantInitial[k] = v
					}
				}
			}

			initial, ch := startWatch(t, dir, WatcherOptions{})
			checkScripts(t, initial.Scripts, wantInitial)
			if initial.Hash != HashScripts(initial.Scripts) || len(initial.Files) != 0 {
				t.Fatalf("initial change: hash %q files %v", initial.Hash, initial.Files)
			}
			prevHash := initial.Hash

			for i, b := range tt.bursts {
				start := time.Now()
				b.do(t, dir)
				if b.files == nil {
					expectNoChangeBefore(t, dir, ch)
					continue
				}
				// A burst is meant to settle into one change; a loaded machine can stretch
				// the writes past the debounce and split it, which is fine as long as the
				// changes end on the burst's content and name every file it touched.
				c := expectChange(t, ch)
				files, changes := slices.Clone(c.Files), 1
				for !mapsEqual(scriptMap(c.Scripts), b.want) {
					c = expectChange(t, ch)
					files, changes = append(files, c.Files...), changes+1
				}
				if len(b.files) > 0 && changes > len(b.files) {
					// More changes than files: the writes were not debounced at all.
					t.Fatalf("burst %d: %d changes for %d files", i, changes, len(b.files))
				}
				slices.Sort(files)
				if files = slices.Compact(files); !slices.Equal(files, b.files) {
					t.Fatalf("burst %d: files = %v, want %v", i, files, b.files)
				}
				if c.Hash != HashScripts(c.Scripts) || c.Hash == prevHash {
					t.Fatalf("burst %d: hash %q (previous %q)", i, c.Hash, prevHash)
				}
				if c.At.Before(start) || c.At.After(time.Now()) {
					t.Fatalf("burst %d: At %v outside [%v, now]", i, c.At, start)
				}
				prevHash = c.Hash
				expectNoChangeBefore(t, dir, ch)
			}
		})
	}
}

func TestWatchPolling(t *testing.T) {
	t.Parallel()
	const interval = 50 * time.Millisecond
	tests := []struct {
		name  string
		do    func(t *testing.T, dir string)
		files []string
	}{
		{"write", func(t *testing.T, dir string) { writeFile(t, dir, "widgets.lua", "return 'v2'") }, []string{"widgets.lua"}},
		{"new file in new subfolder", func(t *testing.T, dir string) { writeFile(t, dir, "lib/a/b.lua", "return 1") }, []string{"lib/a/b.lua"}},
		{"touch", func(t *testing.T, dir string) {
			future := time.Now().Add(time.Hour)
			must(t, os.Chtimes(filepath.Join(dir, "widgets.lua"), future, future))
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFile(t, dir, "widgets.lua", "return 'v1'")
			_, ch := startWatch(t, dir, WatcherOptions{ForcePolling: true, PollInterval: interval})
			tt.do(t, dir)
			if tt.files != nil {
				c := expectChange(t, ch)
				if !slices.Equal(c.Files, tt.files) {
					t.Fatalf("files = %v, want %v", c.Files, tt.files)
				}
			}
			expectNoChangeBefore(t, dir, ch)
		})
	}
}

// lockedBuffer collects log output written by the watcher goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestWatchFallsBackToPolling(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "widgets.lua", "return 'v1'")
	var logs lockedBuffer
	failing := func() (*fsnotify.Watcher, error) {
		return nil, errors.New("inotify_init1: too many open files")
	}
	_, ch := startWith(t, dir, WatcherOptions{PollInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}, failing)
	if !strings.Contains(logs.String(), "polling instead") {
		t.Fatalf("no fallback warning logged: %q", logs.String())
	}
	writeFile(t, dir, "widgets.lua", "return 'v2'")
	if c := expectChange(t, ch); !slices.Equal(c.Files, []string{"widgets.lua"}) {
		t.Fatalf("files = %v", c.Files)
	}
	expectNoChangeBefore(t, dir, ch)
}

// A script that links outside the folder changes without any event inside it.
func TestWatchSymlinkTargetOutsideFolder(t *testing.T) {
	t.Parallel()
	dir, other := t.TempDir(), t.TempDir()
	writeFile(t, other, "ext.lua", "return 'e1'")
	must(t, os.Symlink(filepath.Join(other, "ext.lua"), filepath.Join(dir, "ext.lua")))
	initial, ch := startWatch(t, dir, WatcherOptions{})
	checkScripts(t, initial.Scripts, map[string]string{"ext.lua": "return 'e1'"})
	writeFile(t, other, "ext.lua", "return 'e2'")
	c := expectChange(t, ch)
	checkScripts(t, c.Scripts, map[string]string{"ext.lua": "return 'e2'"})
	expectNoChangeBefore(t, dir, ch)
}

// A read that fails (a dangling link) is logged and retried without a new event.
func TestWatchRetriesFailedRead(t *testing.T) {
	t.Parallel()
	dir, other := t.TempDir(), t.TempDir()
	writeFile(t, dir, "widgets.lua", "return 'v1'")
	var logs lockedBuffer
	_, ch := startWatch(t, dir, WatcherOptions{PollInterval: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	must(t, os.Symlink(filepath.Join(other, "late.lua"), filepath.Join(dir, "late.lua")))
	deadline := time.Now().Add(changeDeadline)
	for !strings.Contains(logs.String(), "reading scripts failed") {
		if time.Now().After(deadline) {
			t.Fatalf("read error not logged: %q", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	writeFile(t, other, "late.lua", "return 'late'") // no event inside dir
	c := expectChange(t, ch)
	if !slices.Equal(c.Files, []string{"late.lua"}) {
		t.Fatalf("files = %v", c.Files)
	}
	checkScripts(t, c.Scripts, map[string]string{"widgets.lua": "return 'v1'", "late.lua": "return 'late'"})
	expectNoChangeBefore(t, dir, ch)
}

// A consumer that did not take a change gets one Change covering both bursts, dated
// from the first.
func TestWatchSlowConsumer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "a.lua", "return 1")
	writeFile(t, dir, "b.lua", "return 1")
	_, ch := startWatch(t, dir, WatcherOptions{})
	start := time.Now()
	// The scenario: two bursts farther apart than the debounce, each complete, while
	// nobody reads the channel; the sleeps are those gaps, not waits for a result.
	writeFile(t, dir, "a.lua", "return 2")
	time.Sleep(3 * testDebounce)
	second := time.Now()
	writeFile(t, dir, "b.lua", "return 2")
	time.Sleep(3 * testDebounce)
	c := expectChange(t, ch)
	if !slices.Equal(c.Files, []string{"a.lua", "b.lua"}) {
		t.Fatalf("files = %v", c.Files)
	}
	if c.At.Before(start) || !c.At.Before(second) {
		t.Fatalf("At = %v, want in [%v, %v)", c.At, start, second)
	}
	expectNoChangeBefore(t, dir, ch)
}

func TestWatchCancelClosesChannel(t *testing.T) {
	t.Parallel()
	for _, polling := range []bool{false, true} {
		t.Run(fmt.Sprintf("polling=%v", polling), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeFile(t, dir, "widgets.lua", "return 1")
			ctx, cancel := context.WithCancel(t.Context())
			_, ch, err := Watch(ctx, dir, WatcherOptions{ForcePolling: polling, PollInterval: 50 * time.Millisecond,
				Logger: testLogger(t)})
			must(t, err)
			writeFile(t, dir, "widgets.lua", "return 2") // a change nobody takes
			time.Sleep(2 * testDebounce)                 // the scenario: cancel while it is pending (or still debounced)
			cancel()
			waitClosed(t, ch)
		})
	}
}

func TestWatchErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "file.lua", "return 1")
	for _, p := range []string{filepath.Join(dir, "missing"), filepath.Join(dir, "file.lua")} {
		if _, ch, err := Watch(t.Context(), p, WatcherOptions{}); err == nil || ch != nil {
			t.Errorf("Watch(%s): err %v, channel %v; want an error and no channel", p, err, ch)
		}
	}
}

func TestHashAndDiff(t *testing.T) {
	s := func(kv ...string) []luabind.Script {
		var out []luabind.Script
		for i := 0; i < len(kv); i += 2 {
			out = append(out, luabind.Script{Name: kv[i], Source: []byte(kv[i+1])})
		}
		return out
	}
	if HashScripts(s("ab", "c")) == HashScripts(s("a", "bc")) {
		t.Error("name/content boundary not part of the hash")
	}
	if first, again := HashScripts(s("a", "1", "b", "2")), HashScripts(s("a", "1", "b", "2")); first != again {
		t.Error("hash not deterministic")
	}
	got := DiffScripts(s("a", "1", "b", "2", "d", "4"), s("b", "2", "c", "3", "d", "5"))
	if want := []string{"a", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("diff = %v, want %v", got, want)
	}
}

// BenchmarkWriteToChange measures the time from a file write to the Change arriving:
// the debounce plus the watcher's own overhead (reported as overhead-ns/op).
func BenchmarkWriteToChange(b *testing.B) {
	for _, debounce := range []time.Duration{DefaultDebounce, 10 * time.Millisecond} {
		for _, n := range []int{1, 50} {
			b.Run(fmt.Sprintf("debounce=%v/files=%d", debounce, n), func(b *testing.B) {
				dir := b.TempDir()
				for i := range n {
					writeFile(b, dir, fmt.Sprintf("s%02d.lua", i), strings.Repeat("-- padding line of a script\n", 40))
				}
				_, ch := startWatch(b, dir, WatcherOptions{Debounce: debounce,
					Logger: slog.New(slog.DiscardHandler)})
				var overhead time.Duration
				i := 0
				for b.Loop() {
					start := time.Now()
					writeFile(b, dir, fmt.Sprintf("s%02d.lua", i%n), fmt.Sprintf("return %d", i))
					c := expectChange(b, ch)
					overhead += time.Since(start) - debounce
					if len(c.Files) != 1 {
						b.Fatalf("files = %v", c.Files)
					}
					i++
				}
				b.ReportMetric(float64(overhead.Nanoseconds())/float64(i), "overhead-ns/op")
			})
		}
	}
}
