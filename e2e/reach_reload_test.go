package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/reloading"
	"github.com/luaop/luaop/testcluster"
)

// Issue 45: a reload reaches running code.

// reachBackup is a backup daemon creating a Job, then one every hour: the Job's
// command comes from a helper of its file, its name from a module; its starts are
// counted on the object (status.starts, from the object's newest status) and in
// its memo (status.memo_starts: the memo is kept across a restart). A change
// handler reports a function of the file the daemon never calls.
const reachBackup = `local luaop = require("luaop")
local naming = require("lib.naming")

local function job_for(ctx, n)
  return {
    apiVersion = "batch/v1", kind = "Job",
    metadata = { name = naming.job_name(ctx.name, n), namespace = ctx.namespace, labels = { backup = ctx.name } },
    spec = { template = { spec = { restartPolicy = "Never",
      containers = { { name = "backup", image = "busybox", command = { "sh", "-c", "echo backup v1" } } } } } },
  }
end

local function unrelated()
  return "unrelated v1"
end

luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
  local starts = (ctx.status.starts or 0) + 1
  ctx.memo.starts = (ctx.memo.starts or 0) + 1
  ctx.patch.status.starts = starts
  ctx.patch.status.memo_starts = ctx.memo.starts
  local n = 0
  repeat
    n = n + 1
    local job, err = luaop.kube.create(job_for(ctx, starts * 100 + n))
    if not job then ctx.logger.error("creating the backup Job failed:", err) end
  until not luaop.sleep(3600)
end, { id = "backup" })

luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
  return { size = ctx.spec.size, unrelated = unrelated() }
end, { id = "seen" })
`

const reachNaming = `local M = {}
function M.job_name(name, n) return name .. "-" .. n end
return M
`

const reachTick = `local luaop = require("luaop")
local fmt = require("lib.fmt")
luaop.timer("examples.luaop.dev/v1/widgets", function(ctx)
  return fmt.stamp()
end, { id = "tick", interval = 0.5 })
`

const reachFmt = `return { stamp = function() return "fmt v1" end }
`

// scriptsFolder is a scripts folder a test edits as an editor saves: a temporary
// file renamed over the old one.
type scriptsFolder struct {
	t   *testing.T
	dir string
}

func newScriptsFolder(t *testing.T, files map[string]string) *scriptsFolder {
	f := &scriptsFolder{t: t, dir: t.TempDir()}
	for name, src := range files {
		f.write(name, src)
	}
	return f
}

// write saves a file, and returns when it was saved.
func (f *scriptsFolder) write(name, src string) time.Time {
	f.t.Helper()
	path := filepath.Join(f.dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(name)+".tmp")
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		f.t.Fatal(err)
	}
	saved := time.Now()
	if err := os.Rename(tmp, path); err != nil {
		f.t.Fatal(err)
	}
	return saved
}

// edit replaces old by new in a file and saves it.
func (f *scriptsFolder) edit(name, old, new string) time.Time {
	f.t.Helper()
	src, err := os.ReadFile(filepath.Join(f.dir, name))
	if err != nil || !strings.Contains(string(src), old) {
		f.t.Fatalf("%s has no %q (%v)", name, old, err)
	}
	return f.write(name, strings.Replace(string(src), old, new, 1))
}

// reloads runs the reload of a scripts folder into op, as luaop dev does, and
// counts the reloads that made new scripts current.
type reloads struct {
	mu   sync.Mutex
	done int
	err  error
}

func watchReloads(t *testing.T, dir string, op *testcluster.RunningOperator) *reloads {
	t.Helper()
	r := &reloads{}
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	reloader := reloading.New(reloading.Options{Dir: dir, Operator: op, View: reloadsView(func(ev reloading.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if ev.Err != nil {
			r.err = ev.Err
			return
		}
		r.done++
	})})
	if err := reloader.Watch(ctx); err != nil {
		t.Fatal(err)
	}
	go reloader.Run(ctx)
	return r
}

// wait waits for the nth reload that made new scripts current.
func (r *reloads) wait(t *testing.T, n int) {
	t.Helper()
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.done >= n, fmt.Sprintf("%d reloads, waiting for %d (last error: %v)", r.done, n, r.err)
	})
}

// jobCommand is the command of the Job name of ns ("" while there is none).
func jobCommand(t *testing.T, ns, name string) string {
	job, err := env.Kube.BatchV1().Jobs(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil || len(job.Spec.Template.Spec.Containers) == 0 {
		return ""
	}
	return strings.Join(job.Spec.Template.Spec.Containers[0].Command, " ")
}

func statusInt(obj *unstructured.Unstructured, field string) int64 {
	v, _, _ := unstructured.NestedInt64(obj.Object, "status", field)
	return v
}

// A daemon whose helper (a local function of its file) or module changed is
// restarted with its new code, its memo kept, and the next Job has the new
// command; an edit of what it cannot reach (a function of its file it never calls,
// lines moved, a module only a timer requires) restarts nothing; a timer whose
// module changed runs the new module at its next tick. The daemon's starts are
// counted on the object.
func TestReloadReachesWhatADaemonOrATimerRuns(t *testing.T) {
	ns := env.Namespace(t)
	folder := newScriptsFolder(t, map[string]string{"backup.lua": reachBackup, "lib/naming.lua": reachNaming, "tick.lua": reachTick, "lib/fmt.lua": reachFmt})
	op := startWith(t, ns, operator.Options{ScriptsDir: folder.dir})
	reloaded := watchReloads(t, folder.dir, op)

	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	waitField(t, widgets, ns, "w", "status.starts", int64(1))
	waitField(t, widgets, ns, "w", "status.tick", "fmt v1")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		cmd := jobCommand(t, ns, "w-101")
		return cmd == "sh -c echo backup v1", "the first Job: " + cmd
	})
	daemonSince := func() (time.Time, bool) {
		for _, d := range op.Reactor().Snapshot().Daemons {
			if d.Name == "w" && d.Handler == "backup" {
				return d.Since, d.Stopping
			}
		}
		return time.Time{}, false
	}
	started, _ := daemonSince()
	// barrier: a change of the widget, handled by the new code of its file (the
	// reload's cycle of the object came before it: adjustDaemons, where a restart
	// begins, runs first in every cycle).
	barrier := func(size int, unrelated string) {
		t.Helper()
		mergePatch(t, widgets, ns, "w", fmt.Sprintf(`{"spec":{"size":%d}}`, size))
		waitField(t, widgets, ns, "w", "status.seen.size", int64(size))
		waitField(t, widgets, ns, "w", "status.seen.unrelated", unrelated)
	}
	unchanged := func(what string, starts int64) {
		t.Helper()
		w := get(t, widgets, ns, "w")
		since, stopping := daemonSince()
		if got := statusInt(w, "starts"); got != starts || stopping || !since.Equal(started) {
			t.Errorf("%s restarted the daemon: status.starts %d (want %d), stopping %v, running since %s (was %s)", what, got, starts, stopping, since, started)
		}
	}

	// What the daemon cannot reach: a function of its file it never calls, and
	// lines moved.
	folder.edit("backup.lua", `"unrelated v1"`, `"unrelated v2"`)
	folder.edit("backup.lua", "local function unrelated()", "-- moved down\n\n\nlocal function unrelated()")
	reloaded.wait(t, 1)
	barrier(2, "unrelated v2")
	unchanged("an edit the daemon cannot reach", 1)

	// Its helper: restarted at once, memo kept; the next Job has the new command.
	saved := folder.edit("backup.lua", `"echo backup v1"`, `"echo backup v2"`)
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		cmd := jobCommand(t, ns, "w-201")
		return cmd == "sh -c echo backup v2", "the restarted daemon's Job: " + cmd
	})
	t.Logf("helper edited: the next Job had the new command %s after the save", time.Since(saved).Round(time.Millisecond))
	w := waitField(t, widgets, ns, "w", "status.starts", int64(2))
	if got := statusInt(w, "memo_starts"); got != 2 {
		t.Errorf("status.memo_starts = %d after the restart, want 2 (the memo kept)", got)
	}
	// The operator sees that status before the next restart: the restarted daemon
	// counts from the status it is given (the operator's newest view of the object,
	// which a watch delivers some time after the write).
	barrier(3, "unrelated v2")

	// A module it requires: restarted too.
	saved = folder.edit("lib/naming.lua", `name .. "-" .. n`, `name .. "-m2-" .. n`)
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		cmd := jobCommand(t, ns, "w-m2-301")
		return cmd == "sh -c echo backup v2", "the Job of the module's new code: " + cmd
	})
	t.Logf("module edited: the next Job had the new name %s after the save", time.Since(saved).Round(time.Millisecond))
	waitField(t, widgets, ns, "w", "status.starts", int64(3))
	started, _ = daemonSince()

	// A module only the timer requires: the timer's next tick runs it; the daemon
	// is not restarted.
	saved = folder.edit("lib/fmt.lua", `"fmt v1"`, `"fmt v2"`)
	waitField(t, widgets, ns, "w", "status.tick", "fmt v2")
	t.Logf("timer's module edited: its result changed %s after the save", time.Since(saved).Round(time.Millisecond))
	barrier(4, "unrelated v2")
	unchanged("an edit of the timer's module", 3)

	if n := countLines(op.Log.String(), `daemon started.*handler=backup`); n != 3 {
		t.Errorf("the daemon started %d times, want 3 (its start and two restarts)", n)
	}
}

// In luaop dev (RetryOnReload), a handler failing and waiting for its backoff (an
// hour here) is retried as soon as its fix is saved.
func TestDevRetriesAFixedHandlerAtOnce(t *testing.T) {
	ns := env.Namespace(t)
	fragile := `local luaop = require("luaop")
luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
  error("not ready yet")
end, { id = "fragile", backoff = 3600 })
`
	folder := newScriptsFolder(t, map[string]string{"fragile.lua": fragile})
	op := startWith(t, ns, operator.Options{ScriptsDir: folder.dir, Processing: processing.Options{RetryOnReload: true}})
	watchReloads(t, folder.dir, op)

	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		for _, o := range op.Reactor().Snapshot().Objects {
			for _, h := range o.Handlers {
				if o.Name == "w" && h.ID == "fragile" && h.State == "waiting" {
					return true, ""
				}
			}
		}
		return false, "waiting for the handler to fail and wait for its backoff"
	})
	saved := folder.edit("fragile.lua", `error("not ready yet")`, `return "fixed"`)
	waitField(t, widgets, ns, "w", "status.fragile", "fixed")
	t.Logf("the fixed handler succeeded %s after the save (its backoff: 1 h)", time.Since(saved).Round(time.Millisecond))
}
