package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// After a restart the operator's first list and watch come from a state older than
// what it already handled (the proxy answers the informer's first list from a list
// the test saved earlier, then watches from its resourceVersion, which replays what
// changed since: Sieve's "time travel", as a lagging watch cache or a second API
// server that is behind would answer): no handler whose success is stored runs again,
// no deletion is handled twice, nothing is lost.
//
// The saved state has: an object created and never handled (a), one updated and not
// handled since (b), one deleted and not released (c), one handled (d), deleted and
// re-created after the state was saved. The operator handles all of it, is killed,
// and starts again on the saved state.
func TestStaleReadsAfterRestart(t *testing.T) {
	rep := &injectionReport{}
	t.Cleanup(func() { reportInjections(t, rep.summary("stale reads after a restart")) })
	for _, lag := range []time.Duration{0, 4 * time.Second} {
		t.Run("lag "+lag.String(), func(t *testing.T) {
			const step = 60 * time.Second
			r := hiddenRig(t, widgets, "", true)
			r.flags = append(r.flags, "--log-level", "debug")
			r.start()
			r.setStep("before")
			for _, name := range []string{"b", "c", "d"} {
				r.create(hiddenObject(widgets, name, 1, 1, ""))
			}
			for _, name := range []string{"b", "c", "d"} {
				r.waitHandledGen(name, 1, true, step)
			}
			r.stop()

			// Changes the operator does not see until it starts again.
			r.setStep("saved")
			client := env.Dynamic.Resource(widgets).Namespace(r.ns)
			r.create(hiddenObject(widgets, "a", 1, 1, ""))
			r.mergePatch("b", `{"spec":{"gen":2,"size":2}}`)
			if err := client.Delete(t.Context(), "c", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			saved, err := client.List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(saved.Items) != 4 {
				t.Fatalf("the saved list has %d objects, want a, b, c (in deletion) and d", len(saved.Items))
			}

			r.setStep("handled")
			r.start()
			r.waitHandledGen("a", 1, true, step)
			r.waitHandledGen("b", 2, true, step)
			d := r.current("d").UID
			r.waitGone(r.uidOf(saved, "c"), step)
			if err := client.Delete(t.Context(), "d", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			r.waitGone(d, step)
			r.create(hiddenObject(widgets, "d", 2, 3, ""))
			r.waitHandledGen("d", 1, true, step)
			r.kill()

			r.setStep("stale")
			r.proxy.ServeStaleList(ofResource(widgets), saved, lag)
			r.start()
			// A re-run on the saved state comes when its object's first cycle does,
			// and any after the lag once the replayed events have come: a new object
			// created after both is handled after them (one worker queue per object,
			// but handled in the order the events came, the new one last).
			time.Sleep(lag + 3*time.Second)
			if r.proxy.StaleListPending() {
				t.Fatalf("the operator's first list was not answered from the saved state")
			}
			r.create(hiddenObject(widgets, "e", 1, 1, ""))
			r.waitHandledGen("e", 1, true, step)
			r.finish(step)
			vs := r.checkRun(finalStateOwed(true))
			rep.scenario("stale first list and watch, lag "+lag.String(), vs)
		})
	}
}

// uidOf is the uid of name in a list.
func (r *rig) uidOf(list *unstructured.UnstructuredList, name string) string {
	for _, item := range list.Items {
		if item.GetName() == name {
			return string(item.GetUID())
		}
	}
	r.t.Fatalf("%s is not in the list", name)
	return ""
}
