package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/reloading"
	"github.com/luaop/luaop/testcluster"
)

const steadyScript = `
local luaop = require("luaop")
luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
	while luaop.sleep(0.1) do end
end, { id = "steady" })
luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
	ctx.memo.n = (ctx.memo.n or 0) + 1
	return ctx.memo.n
end, { id = "count" })
`

const changingScript = `
local luaop = require("luaop")
luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
	ctx.logger.info("changing VERSION running")
	while luaop.sleep(0.1) do end
end, { id = "changing" })
`

// reloadsView hands the reloads a reloading.Reloader shows to its function.
type reloadsView func(reloading.Event)

func (reloadsView) Loaded(string, luabind.LoadReport) {}
func (v reloadsView) Reloaded(ev reloading.Event)     { v(ev) }

func countLines(logs, pattern string) int {
	return len(regexp.MustCompile(pattern).FindAllStringIndex(logs, -1))
}

// Edit the scripts on disk while the operator runs: memos survive, a daemon whose
// code did not change keeps running, one whose code changed restarts once with the
// new code, and a syntax error keeps the old code serving.
func TestHotReloadKeepsMemosAndUnchangedDaemons(t *testing.T) {
	ns := env.Namespace(t)
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		// Save by rename, as editors do.
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	write("a.lua", steadyScript)
	write("b.lua", strings.ReplaceAll(changingScript, "VERSION", "v1"))

	op := startWith(t, ns, operator.Options{ScriptsDir: dir})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	var reloads []reloading.Event
	reloader := reloading.New(reloading.Options{Dir: dir, Operator: op, View: reloadsView(func(ev reloading.Event) {
		mu.Lock()
		reloads = append(reloads, ev)
		mu.Unlock()
	})})
	if err := reloader.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	go reloader.Run(ctx)
	waitReloads := func(n int) reloading.Event {
		t.Helper()
		var last reloading.Event
		testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			if len(reloads) >= n {
				last = reloads[n-1]
			}
			return len(reloads) >= n, "waiting for a reload"
		})
		return last
	}

	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "changing v1 running") && countLines(op.Log.String(), `daemon started.*handler=steady`) == 1,
			"waiting for both daemons"
	})
	// Daemons start a cycle before the creation is recorded: change the spec only
	// once it is, or the creation is (rightly) handled with the new size.
	waitHandled(t, widgets, ns, "w", `{"spec":{"size":1}}`)
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":2}}`)
	waitField(t, widgets, ns, "w", "status.count", int64(1))

	// A comment moves steady's lines; changing's code really changes.
	write("a.lua", "-- a comment that moves every line\n"+steadyScript)
	write("b.lua", strings.ReplaceAll(changingScript, "VERSION", "v2"))
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "changing v2 running"), "waiting for the changed daemon to run its new code"
	})
	if ev := waitReloads(1); ev.Err != nil {
		t.Fatalf("reload failed: %v", ev.Err)
	}
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":3}}`)
	waitField(t, widgets, ns, "w", "status.count", int64(2)) // the memo survived the reload

	// A broken save: the old code keeps serving.
	write("a.lua", steadyScript+"\nluaop.on.create(\n")
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(reloads) > 0 && reloads[len(reloads)-1].Err != nil, "waiting for the failed reload"
	})
	mu.Lock()
	failed := reloads[len(reloads)-1].Err.Error()
	mu.Unlock()
	if !strings.Contains(failed, "a.lua:") {
		t.Errorf("the reload error %q does not name the file and line", failed)
	}
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":4}}`)
	waitField(t, widgets, ns, "w", "status.count", int64(3))

	logs := op.Log.String()
	if n := countLines(logs, `daemon started.*handler=steady`); n != 1 {
		t.Errorf("the unchanged daemon started %d times, want once (not restarted by reloads)", n)
	}
	if n := countLines(logs, `daemon started.*handler=changing`); n != 2 {
		t.Errorf("the changed daemon started %d times, want twice (once restarted)", n)
	}
}
