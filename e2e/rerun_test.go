package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/state"
	"github.com/luaop/luaop/testcluster"
)

// Issue 19: a handler that succeeded never runs again. Many objects, each with a
// daemon writing its status all the time, a create, an update and a delete handler
// that log each run; created, updated and then all deleted at once, in both storage
// modes. Every handler must run exactly once per cause.
func TestSucceededHandlersNeverRunAgainUnderDaemonWrites(t *testing.T) {
	env.Require(t)
	const n = 200
	for _, mode := range []string{"annotations", "status"} {
		t.Run(mode, func(t *testing.T) {
			ns := env.Namespace(t)
			opts := operator.Options{Scripts: script(`
				local luaop = require("luaop")
				luaop.daemon("examples.luaop.dev/v1/widgets", function(ctx)
					local beat = 0
					while luaop.sleep(0.05) do
						beat = beat + 1
						if beat % 4 == 0 then ctx.patch.status.beat = beat end
					end
				end, { id = "heartbeat" })
				luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
					ctx.logger.info("RUN create " .. ctx.name)
					return "made"
				end, { id = "made" })
				luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
					ctx.logger.info("RUN update " .. ctx.name .. " " .. tostring(ctx.spec.size))
					return ctx.spec.size
				end, { id = "updated" })
				luaop.on.delete("examples.luaop.dev/v1/widgets", function(ctx)
					ctx.logger.info("RUN delete " .. ctx.name)
				end, { id = "cleanup" })
				luaop.on.event("examples.luaop.dev/v1/widgets", function(ctx)
					if ctx.type == "DELETED" then ctx.logger.info("GONE " .. ctx.name) end
				end, { id = "gone" })
			`)}
			if mode == "status" {
				opts.Processing = processing.Options{Progress: state.NewStatusProgress("luaop"), DiffBase: state.NewStatusDiffBase("luaop")}
			}
			op := startWith(t, ns, opts)
			client := env.Dynamic.Resource(widgets).Namespace(ns)
			parallel(t, n, func(i int) error {
				_, err := client.Create(t.Context(), mustYAML(t, fmt.Sprintf(
					"{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%03d}, spec: {size: 1}}", i)), metav1.CreateOptions{})
				return err
			})
			testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
				c := strings.Count(op.Log.String(), `msg="RUN create `)
				return c >= n, fmt.Sprintf("%d of %d created", c, n)
			})
			// Daemons write between the causes: every object's heartbeat shows.
			beats := func() map[string]int64 {
				list, err := client.List(t.Context(), metav1.ListOptions{})
				if err != nil {
					t.Fatal(err)
				}
				out := map[string]int64{}
				for _, o := range list.Items {
					if b, ok, _ := unstructured.NestedInt64(o.Object, "status", "beat"); ok {
						out[o.GetName()] = b
					}
				}
				return out
			}
			beatsAfter := func(before map[string]int64) {
				t.Helper()
				testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
					now, behind := beats(), 0
					for i := 0; i < n; i++ {
						name := fmt.Sprintf("w%03d", i)
						if b, ok := now[name]; !ok || b <= before[name] {
							behind++
						}
					}
					return behind == 0, fmt.Sprintf("%d of %d daemons have not written since", behind, n)
				})
			}
			beatsAfter(nil)
			parallel(t, n, func(i int) error {
				_, err := client.Patch(t.Context(), fmt.Sprintf("w%03d", i), "application/merge-patch+json", []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{})
				return err
			})
			testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
				c := strings.Count(op.Log.String(), `msg="RUN update `)
				return c >= n, fmt.Sprintf("%d of %d updated", c, n)
			})
			beatsAfter(beats())
			if err := client.DeleteCollection(t.Context(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
			testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
				list, err := client.List(t.Context(), metav1.ListOptions{})
				if err != nil {
					return false, err.Error()
				}
				return len(list.Items) == 0, fmt.Sprintf("%d objects left", len(list.Items))
			})
			// The DELETED event is the last one of each object: once the operator saw
			// it for every object, no handler can run for them any more.
			testcluster.Eventually(t, 90*time.Second, func() (bool, string) {
				c := strings.Count(op.Log.String(), `msg="GONE `)
				return c >= n, fmt.Sprintf("the operator saw %d of %d objects gone", c, n)
			})
			logs := op.Log.String()
			for _, kind := range []string{"create", "update", "delete"} {
				runs := map[string]int{}
				for _, m := range regexp.MustCompile(`msg="RUN `+kind+` (w\d+)`).FindAllStringSubmatch(logs, -1) {
					runs[m[1]]++
				}
				var twice []string
				for name, c := range runs {
					if c != 1 {
						twice = append(twice, fmt.Sprintf("%s x%d", name, c))
					}
				}
				if len(runs) != n || len(twice) > 0 {
					t.Errorf("%s handler: ran for %d of %d objects; not exactly once: %v", kind, len(runs), n, twice)
				}
			}
		})
	}
}

// parallel runs fn for 0..n-1 with a few concurrent clients.
func parallel(t *testing.T, n int, fn func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
