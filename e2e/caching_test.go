package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// The operator's cache on the real API server (caching, processing's watches as
// views of it, luaop.kube reads from it): what it asks the server for, and what its
// reads answer. Every request the operator makes goes through a proxy that records
// it, so that the tests count them.

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// requestsOf are the recorded requests matching method (any: "") whose path ends
// with the suffix given (the resource, or resource/name) in namespace ns.
func requestsOf(proxy *testcluster.Proxy, method, ns, suffix string) []testcluster.Request {
	var out []testcluster.Request
	for _, r := range proxy.Requests() {
		if (method == "" || r.Method == method) && strings.HasSuffix(r.URL.Path, "/namespaces/"+ns+"/"+suffix) {
			out = append(out, r)
		}
	}
	return out
}

// logCount is how many times the operator logged line.
func logCount(op *testcluster.RunningOperator, line string) int {
	return strings.Count(op.Log.String(), line)
}

func waitLogged(t *testing.T, op *testcluster.RunningOperator, line string) {
	t.Helper()
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), line), "waiting for the operator to log " + line
	})
}

func hasFinalizerOf(t *testing.T, ns, name string) bool {
	t.Helper()
	return slices.Contains(get(t, configMaps, ns, name).GetFinalizers(), processing.Finalizer("luaop.dev"))
}

const replicateScript = `
local luaop = require("luaop")
local selected = {["e2e.luaop.dev/replicate"] = "true"}
luaop.on.create("v1/configmaps", function(ctx)
  ctx.logger.info("CREATED " .. ctx.name .. " .")
end, {id = "created", labels = selected})
luaop.on.delete("v1/configmaps", function(ctx)
  ctx.logger.info("DELETED " .. ctx.name .. " .")
end, {id = "deleted", labels = selected})
`

// Handlers of ConfigMaps whose filter is a plain label match: every list and watch
// of ConfigMaps the operator sends carries that label selector (the API server
// filters; the unlabelled ConfigMaps never reach the operator). A ConfigMap whose
// label is removed leaves the watch (the API server tells it as DELETED): the
// operator takes it for a departure, not a deletion (the delete handler does not
// run, its finalizer goes, the object stays); labelled again, it comes back
// without its create handler running again; a real deletion runs the delete handler.
func TestLabelledWatchSelectsOnTheServerAndADepartureIsNoDeletion(t *testing.T) {
	ns := env.Namespace(t)
	proxy := env.NewProxy(t, testcluster.ProxyOptions{})
	op := startBehindWith(t, proxy, ns, operator.Options{Scripts: script(replicateScript)})

	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: plain}, data: {k: v}}")
	for _, name := range []string{"a", "b"} {
		create(t, configMaps, ns, fmt.Sprintf("{apiVersion: v1, kind: ConfigMap, metadata: {name: %s, labels: {e2e.luaop.dev/replicate: 'true'}}}", name))
	}
	waitLogged(t, op, "CREATED a .")
	waitLogged(t, op, "CREATED b .")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		return hasFinalizerOf(t, ns, "a"), "waiting for the operator's finalizer on a (its delete handler requires it)"
	})

	watches, lists := 0, 0
	for _, r := range requestsOf(proxy, http.MethodGet, ns, "configmaps") {
		sel := r.URL.Query().Get("labelSelector")
		if sel != "e2e.luaop.dev/replicate=true" {
			t.Errorf("the operator read ConfigMaps with labelSelector %q, want the handlers' e2e.luaop.dev/replicate=true: %s", sel, r.URL)
		}
		if r.URL.Query().Get("watch") == "true" {
			watches++
		} else {
			lists++
		}
	}
	if watches == 0 || lists == 0 {
		t.Fatalf("the operator sent %d watch(es) and %d list(s) of ConfigMaps through the proxy; want both", watches, lists)
	}
	if n := logCount(op, "CREATED plain ."); n != 0 {
		t.Errorf("the create handler ran for the unlabelled ConfigMap %d time(s)", n)
	}

	// The label goes: a departure.
	mergePatch(t, configMaps, ns, "a", `{"metadata":{"labels":{"e2e.luaop.dev/replicate":null}}}`)
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return !hasFinalizerOf(t, ns, "a"), "waiting for the operator to remove its finalizer from a, which left its handlers' selection"
	})
	waitLogged(t, op, "left the watch's selection")
	// A real deletion after it: once it is handled, the departure (handled before) has
	// had every chance to run the delete handler.
	if err := env.Dynamic.Resource(configMaps).Namespace(ns).Delete(t.Context(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, op, "DELETED b .")
	waitGone(t, configMaps, ns, "b")
	if n := logCount(op, "DELETED a ."); n != 0 {
		t.Errorf("the delete handler ran %d time(s) for a, whose label was removed: a departure taken for a deletion", n)
	}
	get(t, configMaps, ns, "a") // still there

	// Labelled again: back in the watch, its finalizer again, its creation handled once.
	mergePatch(t, configMaps, ns, "a", `{"metadata":{"labels":{"e2e.luaop.dev/replicate":"true"}}}`)
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return hasFinalizerOf(t, ns, "a"), "waiting for the operator's finalizer on a, labelled again"
	})
	if n := logCount(op, "CREATED a ."); n != 1 {
		t.Errorf("the create handler ran %d times for a (labelled, unlabelled, labelled again); want once: its progress stays on it", n)
	}
}

// A handler writes an object of a resource the scripts declare they read
// (luaop.reads) and reads it back with luaop.kube.get: the read is answered from
// the operator's cache (no GET reaches the API server) and shows the write, though
// the cache's watch of it is held back by 1.5 s (the proxy delays its events): the
// read waits for the cache to show the operator's own write.
func TestCachedReadsSeeTheHandlersOwnWrites(t *testing.T) {
	ns := env.Namespace(t)
	const delay = 1500 * time.Millisecond
	proxy := env.NewProxy(t, testcluster.ProxyOptions{WatchEventDelay: func(r *http.Request) time.Duration {
		if strings.Contains(r.URL.Path, "/gadgets") {
			return delay
		}
		return 0
	}})
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}, spec: {value: '0'}}")
	op := startBehindWith(t, proxy, ns, operator.Options{Scripts: script(`
local luaop = require("luaop")
luaop.reads("e2e.luaop.dev/v1/gadgets")
luaop.on.create("v1/configmaps", function(ctx)
  local n = ctx.body.data.value
  local _, err = luaop.kube.patch("e2e.luaop.dev/v1", "Gadget", ctx.namespace, "g", {spec = {value = n}})
  if err then error(err) end
  local g, err = luaop.kube.get("e2e.luaop.dev/v1", "Gadget", ctx.namespace, "g")
  if not g then error(err) end
  ctx.logger.info("WROTE " .. tostring(n) .. " READ " .. tostring(g.spec.value) .. " .")
end, {id = "write-read", labels = {["e2e.luaop.dev/write"] = "yes"}})
`)})
	patchesBefore := len(requestsOf(proxy, http.MethodPatch, ns, "gadgets/g"))
	for i := 1; i <= 3; i++ {
		create(t, configMaps, ns, fmt.Sprintf("{apiVersion: v1, kind: ConfigMap, metadata: {name: c%d, labels: {e2e.luaop.dev/write: 'yes'}}, data: {value: '%d'}}", i, i))
		waitLogged(t, op, fmt.Sprintf("WROTE %d READ ", i))
		if want := fmt.Sprintf("WROTE %d READ %d .", i, i); !strings.Contains(op.Log.String(), want) {
			t.Errorf("the handler read the gadget it had just written from the cache without its write: want %q in the log", want)
		}
	}
	if n := len(requestsOf(proxy, http.MethodPatch, ns, "gadgets/g")) - patchesBefore; n < 3 {
		t.Fatalf("%d patch(es) of the gadget went through the proxy; want 3 (the handler's writes)", n)
	}
	if gets := requestsOf(proxy, http.MethodGet, ns, "gadgets/g"); len(gets) != 0 {
		t.Errorf("luaop.kube.get of a declared read went to the API server %d time(s); want it answered from the cache", len(gets))
	}
}

// A read the cache cannot answer in full is read from the API server and says so
// once; a miss of what it holds in full is NotFound. The scripts keep only the
// ConfigMaps labelled tier=cached: a get of another one and a list of every
// ConfigMap go to the API server (logged once each, with what to declare), a list
// of tier=cached is answered from the cache, and {live = true} reads the API server.
func TestACacheMissIsAnswerNotARead(t *testing.T) {
	ns := env.Namespace(t)
	proxy := env.NewProxy(t, testcluster.ProxyOptions{})
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: plain}}")
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: kept, labels: {tier: cached}}}")
	op := startBehindWith(t, proxy, ns, operator.Options{Scripts: script(`
local luaop = require("luaop")
luaop.reads("v1/configmaps", {labels = {tier = "cached"}})
luaop.on.create("v1/configmaps", function(ctx)
  local obj, err, reason = luaop.kube.get("v1", "ConfigMap", ctx.namespace, "plain")
  ctx.logger.info("GET plain: " .. tostring(obj ~= nil) .. " " .. tostring(reason) .. " " .. tostring(err) .. " .")
  local items, err = luaop.kube.list("v1", "ConfigMap", ctx.namespace)
  ctx.logger.info("LIST all: " .. tostring(items ~= nil) .. " " .. tostring(err) .. " .")
  items, err = luaop.kube.list("v1", "ConfigMap", ctx.namespace, "tier=cached")
  ctx.logger.info("LIST cached: " .. (items and #items or -1) .. " " .. tostring(items and items[1].metadata.name) .. " .")
  obj, err = luaop.kube.get("v1", "ConfigMap", ctx.namespace, "plain", {live = true})
  ctx.logger.info("GET live plain: " .. tostring(obj ~= nil) .. " " .. tostring(err) .. " .")
end, {id = "probe", labels = {probe = "yes"}})
`)})
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: trigger, labels: {probe: 'yes'}}}")
	waitLogged(t, op, "GET live plain: ")
	out := op.Log.String()
	for _, want := range []string{
		"GET plain: true nil nil .",
		"read from the API server, not from the cache: the operator's cache does not hold every object the read selects: a get of configmaps",
		"LIST all: true nil .",
		"read from the API server, not from the cache: the operator's cache does not hold every object the read selects: a list of configmaps in namespace",
		"LIST cached: 1 kept .",
		"GET live plain: true nil .",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the operator's log lacks %q", want)
		}
	}
	if gets := requestsOf(proxy, http.MethodGet, ns, "configmaps/plain"); len(gets) != 2 {
		t.Errorf("%d GET(s) of the ConfigMap plain reached the API server; want 2 (the partial read, the live read)", len(gets))
	}
	unselected := 0
	for _, r := range requestsOf(proxy, http.MethodGet, ns, "configmaps") {
		switch {
		case r.URL.Query().Get("labelSelector") != "":
		case r.URL.Query().Get("watch") == "true":
			t.Errorf("the operator watched every ConfigMap (no label selector): %s", r.URL)
		default:
			unselected++
		}
	}
	if unselected != 1 {
		t.Errorf("%d list(s) of every ConfigMap reached the API server; want 1 (the handler's list of them all, not cached)", unselected)
	}
}

// A reload that changes the handlers' label filter moves the watch: the operator then
// lists and watches with the new selector, the objects it selects now are handled, and
// those it no longer selects leave as departures (no delete handler, finalizer gone,
// the objects stay). A handler filtering on metadata.name narrows the watch to a field
// selector.
func TestAReloadMovesTheWatchToTheNewSelection(t *testing.T) {
	ns := env.Namespace(t)
	proxy := env.NewProxy(t, testcluster.ProxyOptions{})
	tier := func(value string) []luabind.Script {
		return script(strings.ReplaceAll(replicateScript, `{["e2e.luaop.dev/replicate"] = "true"}`, `{tier = "`+value+`"}`))
	}
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: a1, labels: {tier: a}}}")
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: b1, labels: {tier: b}}}")
	op := startBehindWith(t, proxy, ns, operator.Options{Scripts: tier("a")})
	waitLogged(t, op, "CREATED a1 .")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		return hasFinalizerOf(t, ns, "a1"), "waiting for the operator's finalizer on a1"
	})

	reloaded := time.Now()
	if _, err := op.LoadScripts(t.Context(), tier("b")); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, op, "CREATED b1 .")
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return !hasFinalizerOf(t, ns, "a1"), "waiting for the operator to remove its finalizer from a1, which the new filter leaves out"
	})
	get(t, configMaps, ns, "a1")
	if n := logCount(op, "DELETED a1 ."); n != 0 {
		t.Errorf("the delete handler ran %d time(s) for a1, which only left the handlers' selection", n)
	}
	moved := false
	for _, r := range requestsOf(proxy, http.MethodGet, ns, "configmaps") {
		if sel := r.URL.Query().Get("labelSelector"); r.At.After(reloaded) && sel == "tier=b" {
			moved = true
		} else if sel != "tier=a" && sel != "tier=b" {
			t.Errorf("the operator read ConfigMaps with labelSelector %q: %s", sel, r.URL)
		}
	}
	if !moved {
		t.Errorf("no list or watch of ConfigMaps with labelSelector tier=b after the reload")
	}

	// A name filter: a field selector.
	before := time.Now()
	if _, err := op.LoadScripts(t.Context(), script(`
local luaop = require("luaop")
luaop.on.create("v1/configmaps", function(ctx) ctx.logger.info("NAMED " .. ctx.name .. " .") end,
  {id = "named", field = "metadata.name", value = "c1"})
`)); err != nil {
		t.Fatal(err)
	}
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: c1}}")
	waitLogged(t, op, "NAMED c1 .")
	named := false
	for _, r := range requestsOf(proxy, http.MethodGet, ns, "configmaps") {
		if r.At.After(before) && r.URL.Query().Get("watch") == "true" {
			if fs := r.URL.Query().Get("fieldSelector"); fs == "metadata.name=c1" {
				named = true
			} else {
				t.Errorf("a watch of ConfigMaps after the name filter's reload asks for fieldSelector %q: %s", fs, r.URL)
			}
		}
	}
	if !named {
		t.Errorf("no watch of ConfigMaps with fieldSelector metadata.name=c1 after the reload")
	}
}

// luaop.reads(..., {metadata = true}) keeps the objects' metadata only
// (PartialObjectMetadata): a cached read gives apiVersion, kind and metadata, never the
// data, and sends no GET to the API server.
func TestAMetadataOnlyReadHoldsNoData(t *testing.T) {
	ns := env.Namespace(t)
	proxy := env.NewProxy(t, testcluster.ProxyOptions{})
	create(t, configMaps, ns, "{apiVersion: v1, kind: ConfigMap, metadata: {name: big, labels: {size: big}}, data: {payload: xxxxxxxx}}")
	op := startBehindWith(t, proxy, ns, operator.Options{Scripts: script(`
local luaop = require("luaop")
luaop.reads("v1/configmaps", {metadata = true})
luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx)
  local cm, err = luaop.kube.get("v1", "ConfigMap", ctx.namespace, "big")
  if not cm then error(err) end
  ctx.logger.info("META " .. cm.apiVersion .. " " .. cm.kind .. " " .. cm.metadata.name .. " " .. cm.metadata.labels.size .. " " .. tostring(cm.data) .. " .")
end, {id = "meta"})
`)})
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g}}")
	waitLogged(t, op, "META v1 ConfigMap big big nil .")
	if gets := requestsOf(proxy, http.MethodGet, ns, "configmaps/big"); len(gets) != 0 {
		t.Errorf("%d GET(s) of the ConfigMap reached the API server; want the read answered from the cache", len(gets))
	}
}
