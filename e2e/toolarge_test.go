package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/testcluster"
)

// Issue 34, item 8: two create handlers return about 1 MiB each, each under what
// one write may carry; the second pushes the object over what etcd stores (1.5
// MiB), and the real API server refuses it (etcd's "request is too large"). That
// handler fails for good at once: it ran once (each run is counted in a ConfigMap,
// outside the operator's writes, which the refusal would drop), its failure is
// posted as an Event with the server's reason, no HandlerSucceeded is posted for
// it, the cause ends and the object holds the first result only.
func TestResultPushingTheObjectOverTheLimitFailsForGood(t *testing.T) {
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	ns := env.Namespace(t)
	create(t, configmaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: runs}, data: {}}")
	startWith(t, ns, postingEvents(script(`
		local luaop = require("luaop")
		local function counted(id)
			return function(ctx)
				local cm = assert(luaop.kube.get("v1", "ConfigMap", ctx.namespace, "runs"))
				local n = tonumber((cm.data or {})[id] or "0") + 1
				assert(luaop.kube.patch("v1", "ConfigMap", ctx.namespace, "runs", {data = {[id] = tostring(n)}}))
				return string.rep("x", 1000 * 1024)
			end
		end
		luaop.on.create("examples.luaop.dev/v1/widgets", counted("first"), { id = "first" })
		luaop.on.create("examples.luaop.dev/v1/widgets", counted("second"), { id = "second" })
	`)))
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1}}")
	var obj *unstructured.Unstructured
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		obj = get(t, widgets, ns, "w")
		_, handled := diffBaseOf(obj)
		return handled, "waiting for the cause to end"
	})
	// Handled: no handler of the cause may run again. A retry would come within
	// seconds (the backoff of a framework error starts at 1 s).
	time.Sleep(5 * time.Second)
	runs := get(t, configmaps, ns, "runs")
	if d := runs.Object["data"]; fmt.Sprint(d) != "map[first:1 second:1]" {
		t.Errorf("handler runs counted: %v, want first 1, second 1", d)
	}
	if first, _, _ := unstructured.NestedString(obj.Object, "status", "first"); len(first) != 1000*1024 {
		t.Errorf("status.first holds %d bytes, want the first result", len(first))
	}
	if _, has, _ := unstructured.NestedFieldNoCopy(obj.Object, "status", "second"); has {
		t.Errorf("status.second is on the object: the refused result")
	}
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		list, err := env.Kube.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var failed, succeeded []string
		for _, e := range list.Items {
			switch {
			case e.InvolvedObject.Name != "w":
			case e.Reason == "HandlerFailed" && strings.Contains(e.Message, "second"):
				failed = append(failed, e.Message)
			case e.Reason == "HandlerSucceeded" && strings.Contains(e.Message, "second"):
				succeeded = append(succeeded, e.Message)
			}
		}
		if len(succeeded) > 0 {
			t.Fatalf("HandlerSucceeded posted for the refused run: %q", succeeded)
		}
		if len(failed) == 1 && strings.Contains(strings.ToLower(failed[0]), "too large") {
			t.Logf("the refusal, as posted: %s", failed[0])
			return true, ""
		}
		return false, fmt.Sprintf("HandlerFailed events of the second handler: %q, want one with the server's reason", failed)
	})
}
