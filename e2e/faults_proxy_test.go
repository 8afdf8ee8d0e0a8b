package e2e

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// The faults of this file come from testcluster.Proxy, a reverse proxy between the
// operator (in-process) and the test cluster's kube-apiserver; the test itself
// reads and writes the cluster directly.

// startBehind starts an operator on ns that reaches the cluster through the proxy,
// and waits (generously: every request may be slowed) until it is ready.
func startBehind(t *testing.T, proxy *testcluster.Proxy, ns string) *testcluster.RunningOperator {
	t.Helper()
	return startBehindWith(t, proxy, ns, operator.Options{})
}

// startBehindWith is startBehind with options (the counting script unless they name scripts).
func startBehindWith(t *testing.T, proxy *testcluster.Proxy, ns string, opts operator.Options) *testcluster.RunningOperator {
	t.Helper()
	if opts.Scripts == nil {
		opts.Scripts = script(countingScript)
	}
	op := proxy.Env.StartOperatorAsync(t, ns, opts)
	testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
		return op.Ready(), "waiting for the operator behind the proxy to be ready"
	})
	return op
}

// waitFieldWithin is waitField with a deadline of the caller's.
func waitFieldWithin(t *testing.T, timeout time.Duration, gvr schema.GroupVersionResource, ns, name, path string, want any) {
	t.Helper()
	testcluster.Eventually(t, timeout, func() (bool, string) {
		obj, err := env.Dynamic.Resource(gvr).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, found, _ := unstructured.NestedFieldNoCopy(obj.Object, splitPath(path)...)
		return found && sameValue(got, want), "waiting for " + name + " " + path + ": have " + show(got, found)
	})
}

func waitWidgetGone(t *testing.T, timeout time.Duration, ns, name string) {
	t.Helper()
	testcluster.Eventually(t, timeout, func() (bool, string) {
		_, err := env.Dynamic.Resource(widgets).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("waiting for %s to be gone (its finalizer released): %v", name, err)
	})
}

// onceEach fails the test for every line of want not logged exactly once.
func onceEach(t *testing.T, logs string, want []string) {
	t.Helper()
	for _, w := range want {
		if got := strings.Count(logs, w); got != 1 {
			t.Errorf("%q logged %d times, want exactly once", w, got)
		}
	}
}

// slowLatency is the latency of TestSlowAPIServer: 300 ms to 1 s, at random, before
// every request (lists, watches, gets, patches) is forwarded.
func slowLatency(*http.Request) time.Duration {
	return 300*time.Millisecond + rand.N(700*time.Millisecond)
}

// slowEvents is how late TestSlowAPIServer's watch events arrive: 800 ms to 1.5 s,
// longer than slowConsistency.
func slowEvents(*http.Request) time.Duration {
	return 800*time.Millisecond + rand.N(700*time.Millisecond)
}

// slowConsistency is the operator's ConsistencyTimeout in TestSlowAPIServer: how
// long it waits for the watch to bring back its own last patch.
const slowConsistency = 500 * time.Millisecond

// lateWatchWarning is what the operator logs when the watch did not bring back its
// own last patch within the ConsistencyTimeout.
const lateWatchWarning = "the watch did not deliver the operator's own last patch in time"

// touchAnnotations merge-patches an annotation of widgets w0..w(n-1), one after the
// other, a round at most every 100 ms, until the function it returns is called (which waits for it
// to stop). Errors are reported after it stopped.
func touchAnnotations(t *testing.T, client dynamic.ResourceInterface, n int) func() {
	t.Helper()
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		pace := time.NewTicker(100 * time.Millisecond) // a round of touches at most every 100 ms
		defer pace.Stop()
		for k := 0; ; k++ {
			select {
			case <-stop:
				done <- nil
				return
			case <-pace.C:
			}
			for i := range n {
				patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.luaop.dev/touched":"%d"}}}`, k)
				if _, err := client.Patch(t.Context(), fmt.Sprintf("w%d", i), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					done <- fmt.Errorf("touching w%d: %w", i, err)
					return
				}
			}
		}
	}()
	stopped := false
	return func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		close(stop)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// Every request of the operator waits 300 ms to 1 s in the proxy before it reaches
// kube-apiserver (a watch before its stream starts), and every watch event reaches
// it 800 ms to 1.5 s late, longer than its ConsistencyTimeout (500 ms here): its own
// patches come back through the watch after it stopped waiting for them, and the
// events it handles meanwhile are older than what it wrote. Objects are created,
// updated and deleted, and each handler runs exactly once per change; none is run
// again because a slow answer was taken for a lost one or a stale body for news.
func TestSlowAPIServer(t *testing.T) {
	ns := env.Namespace(t)
	proxy := env.NewProxy(t, testcluster.ProxyOptions{Latency: slowLatency, WatchEventDelay: slowEvents})
	opts := operator.Options{}
	opts.Processing.ConsistencyTimeout = slowConsistency
	op := startBehindWith(t, proxy, ns, opts)
	client := env.Dynamic.Resource(widgets).Namespace(ns)

	const n = 6
	var want []string
	for i := range n {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}, spec: {size: 1}}", i))
	}
	// Once the operator put its finalizer on every object (its finalizer patch
	// must match the resourceVersion it read), a second writer touches an annotation
	// of every object, again and again, until the deletes: when the operator patches
	// an object, the watch still carries changes older than its patch (they reach it
	// 0.8-1.5 s late), and it waits for its own patch past its ConsistencyTimeout.
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			obj, err := client.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return len(obj.GetFinalizers()) > 0, "waiting for the operator's finalizer on " + name
		})
	}
	stopTouching := touchAnnotations(t, client, n)
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		waitFieldWithin(t, 60*time.Second, widgets, ns, name, "status.c", "done")
		waitFieldWithin(t, 60*time.Second, widgets, ns, name, "status.sized", int64(1))
		want = append(want, "RAN a "+name+" .", "RAN b "+name+" .", "RAN c "+name+" .", "SIZED "+name+" 1 .")
	}
	for i := range n {
		mergePatch(t, widgets, ns, fmt.Sprintf("w%d", i), `{"spec":{"size":2}}`)
	}
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		waitFieldWithin(t, 60*time.Second, widgets, ns, name, "status.sized", int64(2))
		want = append(want, "SIZED "+name+" 2 .")
	}
	stopTouching()
	for i := range n {
		if err := client.Delete(t.Context(), fmt.Sprintf("w%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		name := fmt.Sprintf("w%d", i)
		waitWidgetGone(t, 60*time.Second, ns, name)
		want = append(want, "DELETED "+name+" .")
	}
	logs := op.Log.String()
	onceEach(t, logs, want)
	if strings.Contains(logs, "level=ERROR") {
		t.Errorf("errors logged under the slow API server")
	}
	// The path under test was taken: the operator stopped waiting for its own patch.
	if !strings.Contains(logs, lateWatchWarning) {
		t.Errorf("the operator never logged %q: the watch events were not late enough to reach its ConsistencyTimeout (%s)", lateWatchWarning, slowConsistency)
	}

	// The latency was there: on the watches and on the operator's patches.
	var watches, patches int
	var total time.Duration
	requests := proxy.Requests()
	for _, r := range requests {
		total += r.Delay
		switch {
		case r.Delay < 300*time.Millisecond:
			t.Errorf("%s %s went through the proxy after %s, want at least 300ms", r.Method, r.URL, r.Delay)
		case testcluster.IsWatch(&http.Request{URL: r.URL}) && strings.Contains(r.URL.Path, "/widgets"):
			watches++
		case r.Method == http.MethodPatch && strings.Contains(r.URL.Path, "/widgets/"):
			patches++
		}
	}
	t.Logf("%d requests through the proxy, each delayed 300ms-1s (%s in all): %d watches of widgets, %d patches of widgets",
		len(requests), total.Round(time.Millisecond), watches, patches)
	if watches == 0 || patches < n {
		t.Errorf("the operator's watches (%d) and patches (%d) of widgets did not go through the slow proxy", watches, patches)
	}
}

// The operator's watch of widgets ends (its stream is cut) and its next watch,
// which resumes from the last resourceVersion it saw, is answered with the ERROR
// event kube-apiserver sends when that version was compacted away (410 Gone, reason
// Expired), after objects were created, updated and deleted meanwhile. client-go's
// reflector lists again: the changes of the gap are handled, each handler once, and
// nothing handled before runs again.
func TestWatchExpiry410(t *testing.T) {
	ns := env.Namespace(t)
	proxy := env.NewProxy(t, testcluster.ProxyOptions{})
	op := startBehind(t, proxy, ns)
	client := env.Dynamic.Resource(widgets).Namespace(ns)
	ofWidgets := func(r *http.Request) bool {
		return strings.Contains(r.URL.Path, "/namespaces/"+ns+"/widgets")
	}

	for i := range 3 {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}, spec: {size: 1}}", i))
	}
	var want []string
	for i := range 3 {
		name := fmt.Sprintf("w%d", i)
		waitFieldWithin(t, 30*time.Second, widgets, ns, name, "status.c", "done")
		waitFieldWithin(t, 30*time.Second, widgets, ns, name, "status.sized", int64(1))
		want = append(want, "RAN a "+name+" .", "RAN b "+name+" .", "RAN c "+name+" .", "SIZED "+name+" 1 .")
	}

	if cut := proxy.ExpireWatches(ofWidgets); cut == 0 {
		t.Fatalf("no running watch of widgets went through the proxy to cut")
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		return proxy.HeldWatches() > 0, "waiting for the operator to watch widgets again (held by the proxy)"
	})
	// The gap: the operator cannot see these.
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w3}, spec: {size: 1}}")
	mergePatch(t, widgets, ns, "w1", `{"spec":{"size":2}}`)
	if err := client.Delete(t.Context(), "w2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gapEnd := time.Now()
	proxy.AnswerGone()

	waitFieldWithin(t, 60*time.Second, widgets, ns, "w3", "status.c", "done")
	waitFieldWithin(t, 60*time.Second, widgets, ns, "w1", "status.sized", int64(2))
	waitWidgetGone(t, 60*time.Second, ns, "w2")
	want = append(want, "RAN a w3 .", "RAN b w3 .", "RAN c w3 .", "SIZED w3 1 .", "SIZED w1 2 .", "DELETED w2 .")

	if got := proxy.GoneAnswered(); got == 0 {
		t.Fatalf("no watch was answered with 410 Gone")
	}
	relisted := 0
	for _, r := range proxy.Requests() {
		if r.At.After(gapEnd) && !r.Gone && ofWidgets(&http.Request{URL: r.URL}) && testcluster.IsList(&http.Request{Method: r.Method, URL: r.URL}, "widgets") {
			relisted++
		}
	}
	if relisted == 0 {
		t.Errorf("the operator did not list widgets again after its watch got 410 Gone")
	}
	t.Logf("%d watch(es) answered with 410 Gone; widgets listed %d time(s) after", proxy.GoneAnswered(), relisted)

	// The watch after the re-list serves changes as before.
	mergePatch(t, widgets, ns, "w0", `{"spec":{"size":3}}`)
	waitFieldWithin(t, 30*time.Second, widgets, ns, "w0", "status.sized", int64(3))
	want = append(want, "SIZED w0 3 .")
	// A handler run again on a stale body would come after the operator's wait for
	// its own patch (the consistency timeout): the delete handler is the last thing
	// that can happen to an object, so the counts are taken once every object is gone.
	for _, name := range []string{"w0", "w1", "w3"} {
		if err := client.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"w0", "w1", "w3"} {
		waitWidgetGone(t, 60*time.Second, ns, name)
		want = append(want, "DELETED "+name+" .")
	}
	onceEach(t, op.Log.String(), want)
	for _, never := range []string{"SIZED w0 2 .", "SIZED w2 2 .", "SIZED w3 2 ."} {
		if strings.Contains(op.Log.String(), never) {
			t.Errorf("%q logged: a change that was never made was handled", never)
		}
	}
}
