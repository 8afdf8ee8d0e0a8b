package luabind

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

// gather reads the scripts' metrics as Prometheus would.
func gather(t *testing.T, rt *Runtime) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(rt.Metrics())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			switch {
			case m.Counter != nil:
				b.WriteString(f.GetName() + "{" + strings.Join(labels, ",") + "} " + fmtFloat(m.Counter.GetValue()) + "\n")
			case m.Gauge != nil:
				b.WriteString(f.GetName() + "{" + strings.Join(labels, ",") + "} " + fmtFloat(m.Gauge.GetValue()) + "\n")
			case m.Histogram != nil:
				b.WriteString(f.GetName() + "_count{" + strings.Join(labels, ",") + "} " + fmtFloat(float64(m.Histogram.GetSampleCount())) + "\n")
			}
		}
	}
	return b.String()
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

const metricsScript = `local luaop = require("luaop")
local runs = luaop.metrics.counter("widget_runs_total", "Widget handler runs.", {"size", "ok"})
local depth = luaop.metrics.gauge("backlog", "Items waiting.")
local took = luaop.metrics.histogram("fetch_seconds", "Fetch time.", {"target"}, {0.1, 1, 10})
luaop.on.create("example.com/v1/widgets", function(ctx)
  runs:inc({size = ctx.spec.size, ok = true})
  runs:add(2, {size = "big", ok = false})
  depth:set(7)
  depth:inc()
  depth:dec()
  depth:add(-2)
  took:observe(0.5, {target = "api"})
end, {id = "count"})
`

func TestScriptMetricsCountWithLabels(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "m.lua", metricsScript)
	mustInvoke(t, rt, "count", createCause("u1"))
	mustInvoke(t, rt, "count", createCause("u2"))
	got := gather(t, rt)
	for _, want := range []string{
		"luaop_script_widget_runs_total{ok=true,size=3} 2",
		"luaop_script_widget_runs_total{ok=false,size=big} 4",
		"luaop_script_backlog{} 5",
		"luaop_script_fetch_seconds_count{target=api} 2",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

// The same metric survives a reload (and every shard's registration): its count
// goes on; a changed shape fails the reload with the file:line, and the previous
// scripts keep serving.
func TestScriptMetricsSurviveReloadAndRefuseAnotherShape(t *testing.T) {
	rt := loadedRuntime(t, Options{Shards: 3}, "m.lua", metricsScript)
	mustInvoke(t, rt, "count", createCause("u1"))
	mustLoad(t, rt, "m.lua", metricsScript+"\n-- saved again\n")
	mustInvoke(t, rt, "count", createCause("u2"))
	if got := gather(t, rt); !strings.Contains(got, "luaop_script_widget_runs_total{ok=true,size=3} 2") {
		t.Errorf("the count did not go on across the reload:\n%s", got)
	}
	changed := strings.Replace(metricsScript, `{"size", "ok"}`, `{"size"}`, 1)
	_, err := rt.Load(t.Context(), scriptsOf("m.lua", changed))
	checkScriptError(t, err, "m.lua", 2, `"luaop_script_widget_runs_total" was registered at m.lua:2 as a counter with labels {size, ok}`,
		"as a counter with labels {size}", "new name")
	mustInvoke(t, rt, "count", createCause("u3")) // the previous scripts still serve
}

func TestScriptMetricsValidation(t *testing.T) {
	tests := []struct {
		name, src string
		line      int
		want      string
	}{
		{"bad name", `luaop.metrics.counter("2fast", "h")`, 2, `name "2fast"`},
		{"name with a dash", `luaop.metrics.gauge("a-b", "h")`, 2, `name "a-b"`},
		{"bad label name", `luaop.metrics.counter("c", "h", {"ok", "bad-label"})`, 2, "label name bad-label"},
		{"label twice", `luaop.metrics.counter("c", "h", {"a", "a"})`, 2, `label "a" is listed twice`},
		{"labels not a list", `luaop.metrics.counter("c", "h", "a")`, 2, "labelnames must be a list"},
		{"help not a string", `luaop.metrics.counter("c", {"a"})`, 2, "help must be a string"},
		{"buckets not increasing", `luaop.metrics.histogram("h", "h", nil, {1, 1})`, 2, "increasing numbers"},
		{"another type, same name", "luaop.metrics.counter(\"x\", \"h\")\nluaop.metrics.gauge(\"x\", \"h\")", 3, "registered at m.lua:2 as a counter"},
		{"unknown label", `luaop.metrics.counter("c", "h", {"a"}):inc({a = "1", b = "2"})`, 2, "unknown label(s) b; its labels are {a}"},
		{"missing label", `luaop.metrics.counter("c", "h", {"a", "b"}):inc({a = "1"})`, 2, "missing label(s) b"},
		{"labels missing", `luaop.metrics.counter("c", "h", {"a"}):inc()`, 2, "give its labels {a}"},
		{"label value a table", `luaop.metrics.counter("c", "h", {"a"}):inc({a = {}})`, 2, "label a must be a string, a number or a boolean"},
		{"counter going down", `luaop.metrics.counter("c", "h"):add(-1)`, 2, "a counter only goes up"},
		{"set on a counter", `luaop.metrics.counter("c", "h"):set(1)`, 2, "counter luaop_script_c has no set: use inc, add"},
		{"value not a number", `luaop.metrics.gauge("g", "h"):set("x")`, 2, "the value must be a number"},
		{"histogram label le", `luaop.metrics.histogram("h", "h", {"target", "le"})`, 2, `label name "le" is reserved`},
		{"histogram label quantile", `luaop.metrics.histogram("h", "h", {"quantile"})`, 2, `label name "quantile" is reserved`},
		{"counter named like a histogram's count", "luaop.metrics.histogram(\"req\", \"h\")\nluaop.metrics.counter(\"req_count\", \"h\")", 3,
			`"luaop_script_req_count" would clash with "luaop_script_req", registered at m.lua:2 as histogram`},
		{"histogram named like a gauge's prefix", "luaop.metrics.gauge(\"lat_sum\", \"h\")\nluaop.metrics.histogram(\"lat\", \"h\")", 3,
			`"luaop_script_lat" would clash with "luaop_script_lat_sum", registered at m.lua:2 as gauge`},
		{"histogram named like another's bucket", "luaop.metrics.histogram(\"x\", \"h\")\nluaop.metrics.histogram(\"x_bucket\", \"h\")", 3,
			`would clash with "luaop_script_x", registered at m.lua:2`},
		{"dot instead of colon", `local c = luaop.metrics.counter("c", "h"); c.inc({})`, 2, "call it with a colon"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := newTestRuntime(t, Options{Shards: 1})
			_, err := rt.Load(t.Context(), scriptsOf("m.lua", "local luaop = require(\"luaop\")\n"+tt.src+"\n"))
			checkScriptError(t, err, "m.lua", tt.line, tt.want)
		})
	}
}

// ctx.logger.info("msg", {key = value}) writes structured fields; a script's field
// named like one of luaop's own is kept apart.
func TestLoggerStructuredFields(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	rt := loadedRuntime(t, Options{Logger: log, LogEvents: "none"}, "l.lua", `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function(ctx)
  ctx.logger.info("reconciled", {replicas = 3, ready = true, name = "mine", tags = {"a", "b"}})
  ctx.logger.warn("plain", ctx.spec.size)
  ctx.logger.info("a view is printed, not spread", ctx.spec)
end, {id = "log"})
`)
	spec := specOf(t, rt, "log")
	if _, err := rt.Invoke(t.Context(), causes.Call{Handler: spec, Cause: createCause("u1"), Patch: state.NewPatch(), Logger: log.With("name", "w1")}); err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %d: %s", len(lines), buf.String())
	}
	first := lines[0]
	if first["msg"] != "reconciled" || first["replicas"] != float64(3) || first["ready"] != true || first["name"] != "w1" || first["field.name"] != "mine" {
		t.Errorf("structured line = %v", first)
	}
	if tags, _ := first["tags"].([]any); len(tags) != 2 {
		t.Errorf("tags = %v, want the list", first["tags"])
	}
	if lines[1]["msg"] != "plain 3" {
		t.Errorf("plain line = %v", lines[1])
	}
	if msg, _ := lines[2]["msg"].(string); !strings.HasPrefix(msg, "a view is printed, not spread ") {
		t.Errorf("a view as the last argument = %v", lines[2])
	}
}
