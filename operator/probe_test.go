package operator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/luabind"
)

// /healthz is the kubelet's liveness check: it reads the status code, so Probe must
// say whether every probe succeeded, and answer within its deadline even when a probe
// never ends.
func TestProbeReportsFailedAndLateProbes(t *testing.T) {
	tests := []struct {
		name    string
		probe   string
		healthy bool
		want    string
	}{
		{"succeeds", `return "fine"`, true, "fine"},
		{"raises", `error("database unreachable")`, false, "database unreachable"},
		// It never returns: an answer at all came from a deadline, and the message
		// says it was the probe's (800ms), not the handler timeout (2s). No time
		// is measured.
		{"never ends", `while true do end`, false, "probe did not finish within 800ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := fmt.Sprintf("local luaop = require('luaop')\nluaop.on.probe(function(ctx) %s end, {id = 'check'})\n", tt.probe)
			op, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, Options{
				Scripts: []luabind.Script{{Name: "probe.lua", Source: []byte(src)}},
				Runtime: luabind.Options{HandlerTimeout: 2 * time.Second},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { op.runtime.Close(); op.stopEvents() })
			if _, err := op.Load(t.Context()); err != nil {
				t.Fatal(err)
			}
			results, healthy := op.Probe(t.Context())
			if healthy != tt.healthy {
				t.Errorf("healthy = %v, want %v (%v)", healthy, tt.healthy, results)
			}
			if got := fmt.Sprint(results["check"]); !strings.Contains(got, tt.want) {
				t.Errorf("result %q does not contain %q", got, tt.want)
			}
		})
	}
}

// kopf gives probes the indexes (its indexing example reports an index's size on
// /healthz): a probe reads the same operator-wide indexes that timers and change
// handlers read.
func TestProbesReadTheIndexes(t *testing.T) {
	src := `local luaop = require('luaop')
luaop.index("v1/pods", function(ctx) return { [{ctx.namespace, ctx.name}] = true } end, {id = "is_running"})
luaop.on.probe(function(ctx)
  local n = 0
  for _ in pairs(ctx.indexes.is_running) do n = n + 1 end
  return n
end, {id = "pod_count"})
`
	op, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, Options{
		Scripts:    []luabind.Script{{Name: "probe.lua", Source: []byte(src)}},
		ProbeCache: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.runtime.Close(); op.stopEvents() })
	if _, err := op.Load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if results, healthy := op.Probe(t.Context()); !healthy || fmt.Sprint(results["pod_count"]) != "0" {
		t.Fatalf("before any pod: %v (healthy %v), want pod_count 0", results, healthy)
	}
	op.Reactor().Indexes().Set("is_running", "default/p1", map[string]any{"p1": true})
	op.Reactor().Indexes().Set("is_running", "default/p2", map[string]any{"p2": false})
	if results, healthy := op.Probe(t.Context()); !healthy || fmt.Sprint(results["pod_count"]) != "2" {
		t.Fatalf("with two pods indexed: %v (healthy %v), want pod_count 2", results, healthy)
	}
}
