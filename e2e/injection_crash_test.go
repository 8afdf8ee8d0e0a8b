package e2e

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/testcluster"
	"github.com/luaop/luaop/testcluster/ledger"
)

// exhaustiveFaults: LUAOP_FAULTS=exhaustive makes the harness inject at every call of
// its reference runs, on both storages; by default it injects at the first call of
// each kind and each step, on status storage (every kind is still walked).
func exhaustiveFaults() bool { return os.Getenv("LUAOP_FAULTS") == "exhaustive" }

// crashScript has a handler of every change kind, each recording its runs (ledger);
// "checked" fails its first attempt, so that progress records are stored before a
// cause ends and purged when it does.
const crashScript = `
local R = "RESOURCE"
luaop.on.create(R, function(ctx)
  return ledger.ran(ctx, "made", "create g" .. ctx.spec.gen)
end, { id = "made" })
luaop.on.create(R, function(ctx)
  if ctx.retry == 0 then
    error(luaop.temporary_error("a first attempt that fails (progress is stored before the cause ends)", 0.2))
  end
  return ledger.ran(ctx, "checked", "create g" .. ctx.spec.gen)
end, { id = "checked" })
luaop.on.update(R, function(ctx)
  return ledger.ran(ctx, "changed", "update g" .. ctx.old.spec.gen .. "-g" .. ctx.new.spec.gen, ctx.new.spec.gen)
end, { id = "changed" })
luaop.on.field(R, "spec.size", function(ctx)
  return ledger.ran(ctx, "sized", "size " .. tostring(ctx.old) .. "-" .. tostring(ctx.new))
end, { id = "sized" })
luaop.on.delete(R, function(ctx)
  return ledger.ran(ctx, "gone", "delete g" .. ctx.spec.gen)
end, { id = "gone" })
`

var crashHandlers = []string{"made", "checked", "changed", "sized", "gone"}

func crashRig(t *testing.T, gvr schema.GroupVersionResource) *rig {
	return newRig(t, rigOptions{resource: gvr,
		script:   strings.ReplaceAll(crashScript, "RESOURCE", gvr.Group+"/"+gvr.Version+"/"+gvr.Resource),
		handlers: crashHandlers, deletes: []string{"gone"}})
}

func kindOf(gvr schema.GroupVersionResource) string {
	if gvr == gadgets {
		return "Gadget"
	}
	return "Widget"
}

// crashWorkload takes object w through creation, an update, deletion with
// re-creation under its name, and deletion, one step after the other (each waits
// until the step is handled: ledger.Want below is what each step is owed).
func crashWorkload(r *rig) {
	r.t.Helper()
	client := env.Dynamic.Resource(r.resource).Namespace(r.ns)
	manifest := func(inc int) string {
		return fmt.Sprintf("{apiVersion: %s/%s, kind: %s, metadata: {name: w, annotations: {ledger.luaop.dev/luaop-managed: 'yes'}}, spec: {incarnation: %d, gen: 1, size: 1}}",
			r.resource.Group, r.resource.Version, kindOf(r.resource), inc)
	}
	const step = 90 * time.Second // a kill, a restart and a consistency wait fit many times
	r.setStep("create")
	if _, err := client.Create(r.t.Context(), mustYAML(r.t, manifest(1)), metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	first := r.waitHandledGen("w", 1, true, step)

	r.setStep("update")
	if _, err := client.Patch(r.t.Context(), "w", types.MergePatchType, []byte(`{"spec":{"gen":2,"size":2}}`), metav1.PatchOptions{}); err != nil {
		r.t.Fatal(err)
	}
	r.waitHandledGen("w", 2, true, step)

	// Re-created as soon as the name is free: the old incarnation's last cycle and the
	// new one's first are as close as the test can make them.
	r.setStep("delete and re-create")
	if err := client.Delete(r.t.Context(), "w", metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
	testcluster.Eventually(r.t, step, func() (bool, string) {
		_, err := client.Create(r.t.Context(), mustYAML(r.t, manifest(2)), metav1.CreateOptions{})
		return err == nil, fmt.Sprintf("re-creating w once the first is gone: %v", err)
	})
	r.waitGone(first, step)
	second := r.waitHandledGen("w", 1, true, step)

	r.setStep("delete")
	if err := client.Delete(r.t.Context(), "w", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		r.t.Fatal(err)
	}
	r.waitGone(second, step)
}

// crashOwed is what each incarnation of crashWorkload is owed: every handler ran on
// every change it serves.
func crashOwed(inc ledger.Incarnation) []ledger.Want {
	exact := func(h, change string) ledger.Want {
		return ledger.Want{Handler: h, Why: fmt.Sprintf("%q", change), Match: func(r ledger.Run) bool { return r.Change == change }}
	}
	wants := []ledger.Want{exact("made", "create g1"), exact("checked", "create g1"), exact("sized", "size nil-1")}
	if inc.Incarnation == 1 {
		return append(wants, exact("changed", "update g1-g2"), exact("sized", "size 1-2"), exact("gone", "delete g2"))
	}
	return append(wants, exact("gone", "delete g1"))
}

// injectionPoints are the faults to inject, from a reference run's calls: a kill
// before and one after every call (exhaustive), or the first call of each kind in
// each step; and a lost answer (the operator lives on) for every call, or the first
// of each kind.
func injectionPoints(calls []call, every bool) []injection {
	var points []injection
	seen := map[string]bool{}
	ordinal := map[string]int{}
	for _, c := range calls {
		ordinal[c.kind]++
		if key := c.kind + "|" + c.step; every || !seen[key] {
			seen[key] = true
			for _, stage := range []testcluster.Stage{testcluster.BeforeUpstream, testcluster.AfterUpstream} {
				points = append(points, injection{kind: c.kind, ordinal: ordinal[c.kind], stage: stage, about: c})
			}
		}
		if key := "lose|" + c.kind; every || !seen[key] {
			seen[key] = true
			points = append(points, injection{kind: c.kind, ordinal: ordinal[c.kind], stage: testcluster.AfterUpstream, about: c, lose: true})
		}
	}
	return points
}

// injectionReport gathers what the runs of one harness test did, for its summary.
type injectionReport struct {
	mu         sync.Mutex
	explored   int
	notReached []string
	kinds      map[string]map[testcluster.Stage]int
	lost       map[string]int // answers lost per kind
	scenarios  []string       // the runs of scenarios other than a kill at a call
	violations []string
}

func (rep *injectionReport) ran(in injection, fired bool, violations []ledger.Violation) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if !fired {
		rep.notReached = append(rep.notReached, in.String())
		return
	}
	rep.explored++
	if rep.kinds == nil {
		rep.kinds = map[string]map[testcluster.Stage]int{}
		rep.lost = map[string]int{}
	}
	if rep.kinds[in.kind] == nil {
		rep.kinds[in.kind] = map[testcluster.Stage]int{}
	}
	if in.lose {
		rep.lost[in.kind]++
	} else {
		rep.kinds[in.kind][in.stage]++
	}
	for _, v := range violations {
		rep.violations = append(rep.violations, in.String()+": "+v.String())
	}
}

// scenario notes one run of a scenario (a hold, a stale list): an injection point of
// its own.
func (rep *injectionReport) scenario(name string, violations []ledger.Violation) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.explored++
	rep.scenarios = append(rep.scenarios, fmt.Sprintf("%s: %d violations", name, len(violations)))
	for _, v := range violations {
		rep.violations = append(rep.violations, name+": "+v.String())
	}
}

func (rep *injectionReport) summary(title string) string {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d injection points explored, %d violations\n", title, rep.explored, len(rep.violations))
	var kinds []string
	for k := range rep.kinds {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-18s killed before %d, after %d; answer lost %d\n", k, rep.kinds[k][testcluster.BeforeUpstream], rep.kinds[k][testcluster.AfterUpstream], rep.lost[k])
	}
	for _, s := range rep.scenarios {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	for _, n := range rep.notReached {
		fmt.Fprintf(&b, "  not reached: %s\n", n)
	}
	for _, v := range rep.violations {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	return b.String()
}

// reportInjections logs a harness test's summary and appends it to the file
// LUAOP_FAULTS_REPORT names, if any (for RELIABILITY.md).
func reportInjections(t *testing.T, text string) {
	t.Log("\n" + text)
	if path := os.Getenv("LUAOP_FAULTS_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, _ = f.WriteString(text + "\n")
			_ = f.Close()
		}
	}
}

// The operator is killed (SIGKILL) right before, then right after, a call of every
// kind a cycle makes reaches kube-apiserver (finalizer add, handler patch, /status
// write, records purge, finalizer removal, Event post, luaop.kube call), in each step
// of the workload (create, update, delete and re-create, delete), and started again at
// once; each run is checked against README "Semantics" by the ledger. The calls come
// from a reference run without faults.
func TestCrashBeforeAndAfterEveryCall(t *testing.T) {
	resources := []schema.GroupVersionResource{widgets}
	if exhaustiveFaults() {
		resources = append(resources, gadgets) // annotations storage: no status subresource
	}
	for _, gvr := range resources {
		t.Run(gvr.Resource, func(t *testing.T) {
			ref := crashRig(t, gvr)
			ref.start()
			crashWorkload(ref)
			ref.stop()
			if vs := ref.check(crashOwed); len(vs) > 0 {
				t.Fatalf("the reference run (no faults) broke the rules: %v\n%s", vs, ref.runsSummary())
			}
			calls := ref.calls()
			perKind := map[string]int{}
			for _, c := range calls {
				perKind[c.kind]++
			}
			t.Logf("the reference run made %d calls of the kinds faults are injected at: %v", len(calls), perKind)
			for i, c := range calls {
				t.Logf("  call %d: %s of %s (step %q)", i+1, c.kind, c.object, c.step)
			}
			for _, k := range callKinds {
				if perKind[k] == 0 && !(k == callStatusWrite && gvr == gadgets) {
					t.Errorf("the reference run made no %s: the workload does not walk every kind", k)
				}
			}
			points := injectionPoints(calls, exhaustiveFaults())
			rep := &injectionReport{}
			t.Cleanup(func() {
				reportInjections(t, rep.summary("crash before/after each call, "+gvr.Resource))
				rep.mu.Lock()
				defer rep.mu.Unlock()
				for _, k := range callKinds {
					if perKind[k] > 0 && (rep.kinds[k][testcluster.BeforeUpstream] == 0 || rep.kinds[k][testcluster.AfterUpstream] == 0) {
						t.Errorf("no fault was injected both before and after a %s", k)
					}
				}
			})
			for _, in := range points {
				t.Run(in.String(), func(t *testing.T) {
					t.Parallel()
					r := crashRig(t, gvr)
					r.arm(in)
					r.start()
					crashWorkload(r)
					r.stopAll()
					vs := r.check(crashOwed)
					rep.ran(in, r.firedYet(), vs)
					if n := r.processes(); r.firedYet() && !in.lose && n != 2 {
						t.Errorf("%s: %d luaop processes ran, want 2 (the one killed, the one started after)", in, n)
					}
					if !r.firedYet() {
						t.Logf("%s: the call never came (the run took another path)", in)
					}
					for _, v := range vs {
						t.Errorf("%s: %s", in, v)
					}
					if len(vs) > 0 {
						t.Logf("runs:\n%s", r.runsSummary())
					}
				})
			}
		})
	}
}
