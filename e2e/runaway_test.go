package e2e

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// Issue 51: objects sharing the only Lua state (Shards 1, so the sharing is
// certain) with an endless loop, or with a CPU-heavy handler that stays under its
// deadline. Twenty objects' handlers make API calls: each creates a ConfigMap and
// waits (reading it with luaop.kube.get, sleeping in between) for a ConfigMap "go"
// which the test creates once the neighbour has started: so the neighbour takes the
// state while all twenty are in an API call, and each needs the state back while
// the neighbour runs. Every one of them succeeds at its first attempt (ctx.retry 0
// in its status, one ConfigMap each), none is reported as timed out (log,
// luaop_handler_runs_total), and the state was time-sliced
// (luaop_lua_preemptions_total). Before, the loop kept the state until its own
// deadline, and the calls coming back from the API server were failed with it.
func TestNeighbourRunawayDoesNotFailTheOtherHandlers(t *testing.T) {
	const innocents = 20
	for _, tc := range []struct {
		name string
		// neighbour is the end of the neighbour's handler; done counts the
		// innocent handlers that finished, in the shared Lua state.
		neighbour string
		deadline  time.Duration
		// neighbourSucceeds: the neighbour ends under its deadline (else it is
		// stopped by it, once the innocent objects are done).
		neighbourSucceeds bool
	}{
		{"an endless loop", `while true do end`, 10 * time.Second, false},
		// It computes until the twenty others are done, which it can only see if
		// they run while it computes.
		{"a CPU-heavy handler under its deadline", fmt.Sprintf(`local n = 0
			while done < %d do n = n + 1 end
			return {retry = ctx.retry, computed = n > 0}`, innocents), 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := env.Namespace(t)
			src := fmt.Sprintf(`
				local luaop = require("luaop")
				local R = "examples.luaop.dev/v1/widgets"
				local done = 0
				local function configMap(ctx, name, labels)
					local cm, err = luaop.kube.create({ apiVersion = "v1", kind = "ConfigMap",
						metadata = { name = name, namespace = ctx.namespace, labels = labels },
						data = { retry = tostring(ctx.retry) } })
					if not cm then error("creating the ConfigMap " .. name .. ": " .. err) end
				end
				luaop.on.create(R, function(ctx)
					configMap(ctx, "neighbour-started", {})
					%s
				end, { id = "neighbour", when = function(ctx) return ctx.spec.neighbour == true end })
				luaop.on.create(R, function(ctx)
					configMap(ctx, ctx.name, { made = "by-innocent" })
					while not luaop.kube.get("v1", "ConfigMap", ctx.namespace, "go") do luaop.sleep(0.05) end
					local got = luaop.kube.get("v1", "ConfigMap", ctx.namespace, ctx.name)
					done = done + 1
					return { retry = ctx.retry, read = got.metadata.name }
				end, { id = "innocent", when = function(ctx) return ctx.spec.neighbour ~= true end })
			`, tc.neighbour)
			m := metrics.New()
			opts := operator.Options{Scripts: script(src)}
			opts.Runtime.Shards = 1
			opts.Runtime.HandlerTimeout = tc.deadline
			opts.Processing.Workers = innocents + 4
			operator.Instrument(&opts.Processing, m)
			op := startWith(t, ns, opts)
			if err := op.AttachMetrics(m); err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(m.Handler())
			t.Cleanup(srv.Close)

			var wg sync.WaitGroup
			errs := make([]error, innocents)
			for i := range innocents {
				wg.Go(func() {
					obj := mustYAML(t, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: n-%d}, spec: {size: 1}}", i))
					_, errs[i] = env.Dynamic.Resource(widgets).Namespace(ns).Create(t.Context(), obj, metav1.CreateOptions{})
				})
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("creating n-%d: %v", i, err)
				}
			}
			configMaps := func(selector string) []corev1.ConfigMap {
				cms, err := env.Kube.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{LabelSelector: selector})
				if err != nil {
					t.Fatal(err)
				}
				return cms.Items
			}
			// Every innocent handler waits in its API calls for "go"; the neighbour
			// starts, then "go" comes.
			testcluster.Eventually(t, time.Minute, func() (bool, string) {
				n := len(configMaps("made=by-innocent"))
				return n == innocents, fmt.Sprintf("waiting for the innocent handlers to start: %d of %d", n, innocents)
			})
			create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: neighbour}, spec: {size: 1, neighbour: true}}")
			testcluster.Eventually(t, time.Minute, func() (bool, string) {
				_, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "neighbour-started", metav1.GetOptions{})
				return err == nil, "waiting for the neighbour to start"
			})
			if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "go"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for i := range innocents {
				name := fmt.Sprintf("n-%d", i)
				waitField(t, widgets, ns, name, "status.innocent", map[string]any{"retry": int64(0), "read": name})
			}
			cms := configMaps("made=by-innocent")
			if len(cms) != innocents {
				t.Errorf("%d ConfigMaps made by the innocent handlers, want %d (one each)", len(cms), innocents)
			}
			for _, cm := range cms {
				if cm.Data["retry"] != "0" {
					t.Errorf("ConfigMap %s made at retry %s, want the first attempt", cm.Name, cm.Data["retry"])
				}
			}

			// The neighbour ends: with its result, or stopped by its deadline (its
			// own time: it ran that long, the others' turns not counted).
			if tc.neighbourSucceeds {
				waitField(t, widgets, ns, "neighbour", "status.neighbour", map[string]any{"retry": int64(0), "computed": true})
			} else {
				testcluster.Eventually(t, 4*tc.deadline, func() (bool, string) {
					return strings.Contains(op.Log.String(), fmt.Sprintf("exceeded its %s deadline", tc.deadline)), "waiting for the loop's deadline"
				})
				if obj := get(t, widgets, ns, "neighbour"); hasField(obj, "status", "neighbour") {
					t.Errorf("the endless loop has a result: %v", obj.Object["status"])
				}
			}

			// Nobody else is blamed: no line of the innocent handler says it failed,
			// will be retried or ran out of time.
			for _, line := range strings.Split(op.Log.String(), "\n") {
				innocent := strings.Contains(line, "handler=innocent") || strings.Contains(line, `"handler":"innocent"`)
				if innocent && (strings.Contains(line, "deadline") || strings.Contains(line, "retried") || strings.Contains(line, "failed") || strings.Contains(line, "timed out")) {
					t.Errorf("the log blames the innocent handler: %s", line)
				}
			}
			body := scrape(t, srv)
			const c = "widgets.examples.luaop.dev"
			if n := seriesValue(body, `luaop_handler_runs_total{handler="innocent",outcome="success",reason="create",resource="`+c+`"}`); n != innocents {
				t.Errorf("luaop_handler_runs_total of the innocent handler's successes: %v, want %d", n, innocents)
			}
			for _, outcome := range []string{"retry", "failure"} {
				if n := seriesValue(body, `luaop_handler_runs_total{handler="innocent",outcome="`+outcome+`",reason="create",resource="`+c+`"}`); n > 0 {
					t.Errorf("luaop_handler_runs_total of the innocent handler's %s outcomes: %v, want none", outcome, n)
				}
			}
			if n := seriesValue(body, "luaop_lua_preemptions_total"); n < 1 {
				t.Errorf("luaop_lua_preemptions_total = %v: the neighbour never gave the state to the others", n)
			}
		})
	}
}

func hasField(obj *unstructured.Unstructured, path ...string) bool {
	_, found, _ := unstructured.NestedFieldNoCopy(obj.Object, path...)
	return found
}

// scrape reads the metrics served by srv.
func scrape(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
