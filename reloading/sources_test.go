package reloading

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/scriptwatch"
	"github.com/luaop/luaop/testcluster"
)

// fakeAPI is the scripts ConfigMap through the API: the test sends what its watch
// delivers, and sets what Get answers.
type fakeAPI struct {
	changes chan scriptwatch.Change
	stopped chan struct{} // closed when the watch's context ended

	mu     sync.Mutex
	now    scriptwatch.Change // what Get answers
	getErr error
	gets   int
}

func newFakeAPI() *fakeAPI {
	return &fakeAPI{changes: make(chan scriptwatch.Change), stopped: make(chan struct{})}
}

// Watch hands the test's sends over as they are made: a send returns once the
// Reloader took it, so the test orders the two sources.
func (a *fakeAPI) Watch(ctx context.Context) <-chan scriptwatch.Change {
	go func() {
		<-ctx.Done()
		close(a.stopped)
	}()
	return a.changes
}

func (a *fakeAPI) Get(context.Context) (scriptwatch.Change, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gets++
	return a.now, a.getErr
}

func (a *fakeAPI) Name() string { return "ops/scripts" }

func (a *fakeAPI) answer(ch scriptwatch.Change, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.now, a.getErr = ch, err
}

func (a *fakeAPI) getCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gets
}

// version is a content of a.lua with one handler of id as the ConfigMap holds it
// at resourceVersion rv (a change as the API delivers it).
func version(id, rv string) scriptwatch.Change {
	ch := change("a.lua", handlerScript(id))
	ch.ResourceVersion, ch.Keys = rv, []string{"a.lua"}
	return ch
}

// folderOf is the same content as the folder's watcher delivers it.
func folderOf(ch scriptwatch.Change) scriptwatch.Change {
	ch.ResourceVersion, ch.Keys = "", nil
	return ch
}

// newAPIParts are the parts of a Reloader with both sources, started (First, then
// Run); the folder holds data as the kubelet mounts a ConfigMap, or with plain as a
// folder of files.
func newAPIParts(t *testing.T, data map[string]string, plain bool) (*parts, *fakeAPI) {
	t.Helper()
	dir := t.TempDir()
	write := testcluster.WriteConfigMapVolume
	if plain {
		write = writeFiles
	}
	if err := write(dir, data); err != nil {
		t.Fatal(err)
	}
	initial := change("a.lua", data["a.lua"])
	p := newParts(t, true, initial)
	api := newFakeAPI()
	p.reloader.opts.Dir, p.reloader.opts.API = dir, api
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	p.reloader.api, p.reloader.stopAPI = api.Watch(ctx), cancel
	if !p.reloader.First(t.Context()) {
		t.Fatal("First: no scripts serving")
	}
	p.run(t)
	return p, api
}

func writeFiles(dir string, data map[string]string) error {
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// expect takes the next reload shown and checks it loaded id from the source
// (fromAPI) at resourceVersion rv, naming a.lua.
func expect(t *testing.T, p *parts, id string, fromAPI bool, rv string) {
	t.Helper()
	ev := p.view.next(t)
	if ev.Err != nil || p.op.handlers() != id || ev.FromAPI != fromAPI || ev.ResourceVersion != rv || !slices.Equal(ev.Files, []string{"a.lua"}) {
		t.Fatalf("reload %+v serving %q; want %s from the API %v at %q, a.lua changed", ev, p.op.handlers(), id, fromAPI, rv)
	}
}

// Each content is loaded once, whichever source brings it first; the folder is
// placed among the API's contents by its hash, so that the kubelet's copy arriving
// late loads nothing and an older one never replaces newer scripts; a folder
// content the API was not seen with is asked about.
func TestTwoSourcesOneReloadPerContentNewestWins(t *testing.T) {
	p, api := newAPIParts(t, map[string]string{"a.lua": handlerScript("v1")}, false)

	// The watch's first listing: the folder's content, nothing to load.
	api.changes <- version("v1", "10")
	// An edit: the API first, at once.
	api.changes <- version("v2", "11")
	expect(t, p, "v2", true, "11")
	// The kubelet's copy of it, a minute later: nothing.
	p.changes <- folderOf(version("v2", ""))
	// A kubelet that lags (a cached older content): older, not loaded.
	p.changes <- folderOf(version("v1", ""))
	api.changes <- version("v3", "12")
	expect(t, p, "v3", true, "12")
	if !strings.Contains(p.logs.String(), "holds older scripts than the ConfigMap's") {
		t.Errorf("the older folder kept out silently:\n%s", p.logs.String())
	}

	// The folder ahead of the watch: the API confirms it is the newest; the watch's
	// event then loads nothing.
	api.answer(version("v4", "13"), nil)
	p.changes <- folderOf(version("v4", ""))
	expect(t, p, "v4", false, "13")
	api.changes <- version("v4", "13")
	api.changes <- version("v5", "14")
	expect(t, p, "v5", true, "14")

	// A folder content the ConfigMap does not have: not loaded.
	p.changes <- folderOf(version("stray", ""))
	// A folder content while the ConfigMap has moved on further: the ConfigMap's.
	api.answer(version("v7", "16"), nil)
	p.changes <- folderOf(version("v6", ""))
	expect(t, p, "v7", true, "16")
	api.changes <- version("v6", "15") // a watch behind: older than what serves
	api.changes <- version("v7", "16")
	// The API cannot be asked: the folder's change is loaded.
	api.answer(scriptwatch.Change{}, errors.New("connection refused"))
	p.changes <- folderOf(version("v8", ""))
	expect(t, p, "v8", false, "")
	api.changes <- version("v9", "17")
	expect(t, p, "v9", true, "17")

	if n := api.getCount(); n != 4 {
		t.Errorf("the API was asked %d times, want 4 (once per folder content it was not seen with)", n)
	}
	_, _, loaded, _ := p.op.snapshot()
	if want := []string{"v1", "v2", "v3", "v4", "v5", "v7", "v8", "v9"}; !slices.Equal(loaded, want) {
		t.Errorf("loads %v, want %v: one per content, none older than what served", loaded, want)
	}
	if kept := p.lastGood.keptHashes(); len(kept) != 8 {
		t.Errorf("last good kept %d sets, want every one that loaded (8)", len(kept))
	}
}

// A broken edit of the ConfigMap keeps the scripts running and names file:line,
// once: the kubelet's copy of it does not fail again.
func TestTwoSourcesBrokenEditFailsOnce(t *testing.T) {
	p, api := newAPIParts(t, map[string]string{"a.lua": handlerScript("v1")}, false)
	broken := change("a.lua", brokenScript)
	broken.ResourceVersion, broken.Keys = "20", []string{"a.lua"}
	api.changes <- broken
	if ev := p.view.next(t); ev.Err == nil || !strings.Contains(ev.Err.Error(), "a.lua:3") || !ev.FromAPI || p.op.handlers() != "v1" {
		t.Fatalf("broken edit shown as %+v, serving %q; want the error at a.lua:3 from the API, v1 serving", ev, p.op.handlers())
	}
	p.changes <- folderOf(broken)
	api.changes <- version("fixed", "21")
	expect(t, p, "fixed", true, "21")
	if reloads, _ := p.metrics.snapshot(t); !slices.Equal(reloads, []bool{true, false, true}) {
		t.Errorf("reloads counted %v, want [true false true]: the folder's copy of the broken edit loads nothing", reloads)
	}
}

// A start on broken scripts without last good ones waits, unready, for the fix: the
// ConfigMap's fix serves as soon as the API brings it, not a minute later.
func TestTwoSourcesFixOfABrokenStartFromTheAPI(t *testing.T) {
	dir := t.TempDir()
	if err := testcluster.WriteConfigMapVolume(dir, map[string]string{"a.lua": brokenScript}); err != nil {
		t.Fatal(err)
	}
	p := newParts(t, true, change("a.lua", brokenScript))
	api := newFakeAPI()
	p.reloader.opts.Dir, p.reloader.opts.API, p.reloader.opts.LastGood = dir, api, nil
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p.reloader.api, p.reloader.stopAPI = api.Watch(ctx), cancel
	served := make(chan bool, 1)
	go func() { served <- p.reloader.First(t.Context()) }()
	if ev := p.view.next(t); ev.Err == nil || !ev.NothingServes {
		t.Fatalf("first load shown as %+v, want its error, nothing serving", ev)
	}
	api.changes <- version("fixed", "30")
	select {
	case ok := <-served:
		if !ok || p.op.handlers() != "fixed" {
			t.Fatalf("First: served %v with %q, want the API's fix", ok, p.op.handlers())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the API's fix did not end the wait")
	}
}

// Where the folder is not the ConfigMap alone (a key of another source, or no
// kubelet volume at all), the first content of the API says so and the folder stays
// the only source: the watch is stopped, the folder's changes load as before.
func TestTwoSourcesFolderNotTheConfigMapAlone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		data  map[string]string
		plain bool
		why   string
	}{
		{name: "projected", data: map[string]string{"a.lua": handlerScript("v1"), "token": "x"}, why: "token is not a key of the ConfigMap"},
		{name: "plain folder", data: map[string]string{"a.lua": handlerScript("v1")}, plain: true, why: "no ..data link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, api := newAPIParts(t, tc.data, tc.plain)
			api.changes <- version("v2", "40")
			select {
			case <-api.stopped:
			case <-time.After(30 * time.Second):
				t.Fatal("the watch was not stopped")
			}
			p.changes <- folderOf(version("v3", ""))
			expect(t, p, "v3", false, "")
			logs := p.logs.String()
			if !strings.Contains(logs, "the scripts are read from the folder only") || !strings.Contains(logs, tc.why) {
				t.Errorf("the log does not say why the folder alone is read (%q):\n%s", tc.why, logs)
			}
			if _, _, loaded, _ := p.op.snapshot(); slices.Contains(loaded, "v2") {
				t.Errorf("the API's content loaded over a folder that is not the ConfigMap alone: %v", loaded)
			}
		})
	}
}
