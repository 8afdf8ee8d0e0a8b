package luabind

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/luaop/luaop/luabind/internal/luavalue"
)

// ScriptMetricPrefix starts the name of every metric the scripts register, so that
// they never collide with luaop's own.
const ScriptMetricPrefix = "luaop_script_"

// ScriptMetrics are the Prometheus metrics the scripts register with
// luaop.metrics.counter / gauge / histogram. A metric lives as long as the
// operator: every shard runs the scripts' top level, and every reload runs it again,
// so registering a name again with the same type, labels (and buckets) returns the
// same metric; another shape is an error naming where the name was registered
// first. A metric the scripts no longer register keeps its last values until the
// operator restarts.
//
// It is a prometheus.Collector (an unchecked one: its metrics are only known as the
// scripts register them); Runtime.Metrics gives the runtime's. mu is a leaf.
type ScriptMetrics struct {
	mu      sync.Mutex
	metrics map[string]*scriptMetric
}

type scriptMetric struct {
	name    string // with the prefix
	kind    string // counter, gauge, histogram
	labels  []string
	buckets []float64
	source  string // file:line of the first registration
	help    string // of the first registration; not part of the shape
	// one of these, by kind
	counter   *prometheus.CounterVec
	gauge     *prometheus.GaugeVec
	histogram *prometheus.HistogramVec
}

// NewScriptMetrics makes an empty set.
func NewScriptMetrics() *ScriptMetrics {
	return &ScriptMetrics{metrics: map[string]*scriptMetric{}}
}

// Describe sends nothing: the scripts' metrics are not known in advance.
func (m *ScriptMetrics) Describe(chan<- *prometheus.Desc) {}

// Collect sends every registered metric's series.
func (m *ScriptMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	all := make([]prometheus.Collector, 0, len(m.metrics))
	for _, sm := range m.metrics {
		all = append(all, sm.collector())
	}
	m.mu.Unlock()
	for _, c := range all {
		c.Collect(ch)
	}
}

func (sm *scriptMetric) collector() prometheus.Collector {
	switch {
	case sm.counter != nil:
		return sm.counter
	case sm.gauge != nil:
		return sm.gauge
	}
	return sm.histogram
}

// Metrics returns the metrics the scripts registered, to add to a Prometheus
// registry.
func (r *Runtime) Metrics() *ScriptMetrics { return r.scriptMetrics }

var (
	metricNameRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	labelNameRE  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// register returns the metric of that name, made now, or the one registered before
// when its shape is the same.
func (m *ScriptMetrics) register(want *scriptMetric) (*scriptMetric, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if have, ok := m.metrics[want.name]; ok {
		if have.kind != want.kind || !slices.Equal(have.labels, want.labels) || !slices.Equal(have.buckets, want.buckets) {
			return nil, fmt.Errorf("metric %q was registered at %s as %s; it is registered here as %s: "+
				"a metric keeps its type, labels and buckets while luaop runs (give the new shape a new name, or restart luaop)",
				want.name, have.source, have.shape(), want.shape())
		}
		return have, nil
	}
	if other := m.clash(want); other != nil {
		return nil, fmt.Errorf("metric %q would clash with %q, registered at %s as %s: "+
			"a histogram %q is exposed as the series %s_bucket, %s_sum and %s_count, "+
			"and Prometheus refuses a scrape with two metrics of one name (give one of them another name)",
			want.name, other.name, other.source, other.kind, histogramOf(want, other), histogramOf(want, other), histogramOf(want, other), histogramOf(want, other))
	}
	switch want.kind {
	case "counter":
		want.counter = prometheus.NewCounterVec(prometheus.CounterOpts{Name: want.name, Help: want.helpOr()}, want.labels)
	case "gauge":
		want.gauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: want.name, Help: want.helpOr()}, want.labels)
	case "histogram":
		want.histogram = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: want.name, Help: want.helpOr(), Buckets: want.buckets}, want.labels)
	}
	m.metrics[want.name] = want
	return want, nil
}

// histogramSuffixes are the series a histogram is exposed as, besides its name.
var histogramSuffixes = []string{"_bucket", "_sum", "_count"}

// clash returns the metric registered before whose series would have the same name
// as one of want's: a histogram "x" and a metric "x_count", "x_sum" or "x_bucket",
// whichever comes first. Gathering both would fail the whole scrape.
func (m *ScriptMetrics) clash(want *scriptMetric) *scriptMetric {
	if want.kind == "histogram" {
		for _, suffix := range histogramSuffixes {
			if other, ok := m.metrics[want.name+suffix]; ok {
				return other
			}
		}
	}
	for _, suffix := range histogramSuffixes {
		base, ok := strings.CutSuffix(want.name, suffix)
		if !ok {
			continue
		}
		if other, ok := m.metrics[base]; ok && other.kind == "histogram" {
			return other
		}
	}
	return nil
}

// histogramOf names the histogram of two clashing metrics.
func histogramOf(a, b *scriptMetric) string {
	if a.kind == "histogram" && (b.kind != "histogram" || len(a.name) < len(b.name)) {
		return a.name
	}
	return b.name
}

func (sm *scriptMetric) helpOr() string {
	if sm.help != "" {
		return sm.help
	}
	return "Registered by the scripts at " + sm.source + "."
}

func (sm *scriptMetric) shape() string {
	s := "a " + sm.kind + " with labels {" + strings.Join(sm.labels, ", ") + "}"
	if sm.kind == "histogram" {
		parts := make([]string, len(sm.buckets))
		for i, b := range sm.buckets {
			parts[i] = fmt.Sprint(b)
		}
		s += " and buckets {" + strings.Join(parts, ", ") + "}"
	}
	return s
}

const metricClass = "luaop.metric"

// maxLabelBytes bounds the label values of one observation, in all, and a metric's
// help text.
const maxLabelBytes = 4 << 10

// metricsModule builds luaop.metrics: counter, gauge and histogram.
func (s *shard) metricsModule() *lua.LTable {
	L := s.L
	t := L.NewTable()
	for _, kind := range []string{"counter", "gauge", "histogram"} {
		t.RawSetString(kind, L.NewFunction(s.registerMetric(kind)))
	}
	mt := L.NewTypeMetatable(metricClass)
	methods := L.NewTable()
	for name, fn := range map[string]lua.LGFunction{
		"inc":     metricOp("inc", false),
		"dec":     metricOp("dec", false),
		"add":     metricOp("add", true),
		"set":     metricOp("set", true),
		"observe": metricOp("observe", true),
	} {
		methods.RawSetString(name, L.NewFunction(fn))
	}
	mt.RawSetString("__index", methods)
	mt.RawSetString("__tostring", L.NewFunction(func(L *lua.LState) int {
		sm := checkMetric(L, "tostring")
		L.Push(lua.LString(sm.kind + " " + sm.name))
		return 1
	}))
	return t
}

// registerMetric makes luaop.metrics.<kind>(name, help, labelnames[, buckets]).
func (s *shard) registerMetric(kind string) lua.LGFunction {
	return func(L *lua.LState) int {
		what := "luaop.metrics." + kind
		name := L.CheckString(1)
		if !metricNameRE.MatchString(name) || strings.HasPrefix(name, "__") {
			L.RaiseError("%s: name %q: use letters, digits and '_', not starting with a digit (it becomes %s<name>)", what, name, ScriptMetricPrefix)
		}
		help, ok := L.Get(2).(lua.LString)
		if !ok && L.Get(2) != lua.LNil {
			L.RaiseError("%s %q: help must be a string (what the metric measures), got %s", what, name, L.Get(2).Type())
		}
		if len(help) > maxLabelBytes {
			L.RaiseError("%s %q: help of %d bytes, more than %d", what, name, len(help), maxLabelBytes)
		}
		sm := &scriptMetric{name: ScriptMetricPrefix + name, kind: kind, source: s.where(L), help: string(help)}
		if lv := L.Get(3); lv != lua.LNil {
			names, ok := lv.(*lua.LTable)
			if !ok {
				L.RaiseError("%s %q: labelnames must be a list of strings, such as {\"resource\", \"outcome\"}; got %s", what, name, lv.Type())
			}
			for i := 1; i <= names.Len(); i++ {
				ln, ok := names.RawGetInt(i).(lua.LString)
				if !ok || !labelNameRE.MatchString(string(ln)) || strings.HasPrefix(string(ln), "__") {
					L.RaiseError("%s %q: label name %s: use letters, digits and '_', not starting with a digit or \"__\"", what, name, lua.LVAsString(names.RawGetInt(i)))
				}
				if kind == "histogram" && (ln == "le" || ln == "quantile") {
					L.RaiseError("%s %q: label name %q is reserved for the buckets of a histogram (and the quantiles of a summary); give the label another name", what, name, string(ln))
				}
				if slices.Contains(sm.labels, string(ln)) {
					L.RaiseError("%s %q: label %q is listed twice", what, name, string(ln))
				}
				sm.labels = append(sm.labels, string(ln))
			}
			if n := countKeys(names); n != len(sm.labels) {
				L.RaiseError("%s %q: labelnames must be a list of strings (no other keys)", what, name)
			}
		}
		if kind == "histogram" {
			sm.buckets = prometheus.DefBuckets
			if lv := L.Get(4); lv != lua.LNil {
				bt, ok := lv.(*lua.LTable)
				if !ok || bt.Len() == 0 {
					L.RaiseError("%s %q: buckets must be a list of increasing numbers, such as {0.1, 0.5, 1, 5}", what, name)
				}
				sm.buckets = nil
				for i := 1; i <= bt.Len(); i++ {
					b, ok := bt.RawGetInt(i).(lua.LNumber)
					if !ok || (len(sm.buckets) > 0 && float64(b) <= sm.buckets[len(sm.buckets)-1]) || math.IsNaN(float64(b)) {
						L.RaiseError("%s %q: buckets must be a list of increasing numbers, such as {0.1, 0.5, 1, 5}", what, name)
					}
					sm.buckets = append(sm.buckets, float64(b))
				}
			}
		}
		got, err := s.rt.scriptMetrics.register(sm)
		if err != nil {
			L.RaiseError("%s: %v", what, err)
		}
		ud := L.NewUserData()
		ud.Value = got
		L.SetMetatable(ud, L.GetTypeMetatable(metricClass))
		L.Push(ud)
		return 1
	}
}

func countKeys(t *lua.LTable) int {
	n := 0
	t.ForEach(func(lua.LValue, lua.LValue) { n++ })
	return n
}

func checkMetric(L *lua.LState, method string) *scriptMetric {
	ud, ok := L.Get(1).(*lua.LUserData)
	if ok {
		if sm, ok := ud.Value.(*scriptMetric); ok {
			return sm
		}
	}
	L.RaiseError("%s: call it with a colon on a metric, such as requests:%s(...)", method, method)
	return nil
}

// metricOp makes one method of a metric: m:inc(labels), m:dec(labels),
// m:add(v, labels), m:set(v, labels), m:observe(v, labels).
func metricOp(op string, takesValue bool) lua.LGFunction {
	return func(L *lua.LState) int {
		sm := checkMetric(L, op)
		allowed := map[string][]string{"counter": {"inc", "add"}, "gauge": {"inc", "dec", "add", "set"}, "histogram": {"observe"}}[sm.kind]
		if !slices.Contains(allowed, op) {
			L.RaiseError("%s %s has no %s: use %s", sm.kind, sm.name, op, strings.Join(allowed, ", "))
		}
		v, labelsAt := 1.0, 2
		if takesValue {
			n, ok := L.Get(2).(lua.LNumber)
			if !ok || math.IsNaN(float64(n)) {
				L.RaiseError("%s:%s: the value must be a number, got %s", sm.name, op, L.Get(2).Type())
			}
			v, labelsAt = float64(n), 3
		}
		if sm.kind == "counter" && v < 0 {
			L.RaiseError("%s:%s(%v): a counter only goes up; use a gauge for values that go down", sm.name, op, v)
		}
		values := metricLabels(L, sm, op, labelsAt)
		switch {
		case sm.counter != nil:
			sm.counter.WithLabelValues(values...).Add(v)
		case sm.gauge != nil:
			g := sm.gauge.WithLabelValues(values...)
			switch op {
			case "set":
				g.Set(v)
			case "dec":
				g.Sub(1)
			default:
				g.Add(v)
			}
		default:
			sm.histogram.WithLabelValues(values...).Observe(v)
		}
		return 0
	}
}

// metricLabels reads the labels table of a call: exactly the metric's label names,
// with string, number or boolean values.
func metricLabels(L *lua.LState, sm *scriptMetric, op string, at int) []string {
	lv := L.Get(at)
	if lv == lua.LNil {
		if len(sm.labels) > 0 {
			L.RaiseError("%s:%s: give its labels {%s}", sm.name, op, strings.Join(sm.labels, ", "))
		}
		return nil
	}
	t, ok := lv.(*lua.LTable)
	if !ok {
		L.RaiseError("%s:%s: labels must be a table such as {%s = \"...\"}, got %s", sm.name, op, firstOr(sm.labels, "label"), lv.Type())
	}
	values := make([]string, len(sm.labels))
	// Label values are kept for as long as the operator runs (a series each):
	// they go through the bounded path, within maxLabelBytes in all.
	budget := luavalue.NewBudget(luavalue.Limits{MaxBytes: maxLabelBytes})
	var unknown []string
	seen := 0
	t.ForEach(func(k, v lua.LValue) {
		ks, ok := k.(lua.LString)
		i := -1
		if ok {
			i = slices.Index(sm.labels, string(ks))
		}
		if i < 0 {
			unknown = append(unknown, lua.LVAsString(k))
			return
		}
		switch v.(type) {
		case lua.LString, lua.LNumber, lua.LBool:
			text, err := budget.Text(L, v)
			if err != nil {
				L.RaiseError("%s:%s: label values of more than %d bytes in all: each set of values is a series kept for as long as the operator runs; keep them short (%v)", sm.name, op, maxLabelBytes, err)
			}
			values[i] = text
		default:
			L.RaiseError("%s:%s: label %s must be a string, a number or a boolean, got %s", sm.name, op, string(ks), v.Type())
		}
		seen++
	})
	if len(unknown) > 0 {
		sort.Strings(unknown)
		L.RaiseError("%s:%s: unknown label(s) %s; its labels are {%s}", sm.name, op, strings.Join(unknown, ", "), strings.Join(sm.labels, ", "))
	}
	if seen != len(sm.labels) {
		var missing []string
		for _, l := range sm.labels {
			if t.RawGetString(l) == lua.LNil {
				missing = append(missing, l)
			}
		}
		L.RaiseError("%s:%s: missing label(s) %s", sm.name, op, strings.Join(missing, ", "))
	}
	return values
}

func firstOr(list []string, def string) string {
	if len(list) > 0 {
		return list[0]
	}
	return def
}
