package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/yaml12"
)

// promqlWords are the functions, aggregations and keywords of PromQL, and Grafana's
// variables: not metric names.
var promqlWords = map[string]bool{
	"sum": true, "max": true, "min": true, "avg": true, "count": true, "by": true, "without": true, "rate": true,
	"increase": true, "irate": true, "deriv": true, "histogram_quantile": true, "clamp_min": true, "clamp_max": true,
	"and": true, "or": true, "unless": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"abs": true, "delta": true, "topk": true, "bottomk": true, "label_values": true, "offset": true, "bool": true,
	"inf": true, "nan": true, "e": true, "absent": true, "time": true,
}

// kubeStateMetrics are the series of kube-state-metrics that alerts may query: what
// luaop cannot report itself (its own exit status).
var kubeStateMetrics = []string{"kube_pod_container_status_last_terminated_exitcode", "kube_pod_container_status_restarts_total"}

// servedNames are the metric names luaop serves: the metrics package's, and those
// the operator adds at scrape time (the Lua budgets').
func servedNames(t *testing.T) []string {
	t.Helper()
	names := metrics.New().Names()
	ch := make(chan *prometheus.Desc, 8)
	go func() { (*luabind.Runtime)(nil).BudgetMetrics().Describe(ch); close(ch) }()
	for d := range ch {
		if m := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

var (
	promStrings   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promGrouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promSelectors = regexp.MustCompile(`\{[^{}]*\}`)
	promRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promIdents    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
)

// metricNames are the metric names a PromQL expression reads.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promGrouping.ReplaceAllString(e, " ")
	e = promSelectors.ReplaceAllString(e, " ")
	e = promRanges.ReplaceAllString(e, " ")
	var out []string
	for _, id := range promIdents.FindAllString(e, -1) {
		if !promqlWords[id] && !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func TestMetricNamesOfPromQL(t *testing.T) {
	got := metricNames(`sum by (namespace, handler) (rate(luaop_handler_runs_total{outcome="failure", x=~"a{1}"}[10m])) / clamp_min(sum(rate(x_total[5m])), 1e-9) > 0.5`)
	if strings.Join(got, ",") != "luaop_handler_runs_total,x_total" {
		t.Errorf("metric names %v", got)
	}
}

// The PrometheusRule of deploy/components/prometheus: every alert has an
// expression, a duration, a severity and a summary, and queries only metrics luaop
// serves (a renamed metric must not leave an alert that never fires). Its PromQL and
// format are parsed by Prometheus's own rule parser (promtool's) in tools/promcheck.
func TestPrometheusRuleQueriesLuaopMetrics(t *testing.T) {
	deployDir, _, _ := paths(t)
	data, err := os.ReadFile(filepath.Join(deployDir, "components", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := yaml12.Unmarshal(data)
	if err != nil {
		t.Fatal(err)
	}
	var rule struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []struct {
				Name  string `json:"name"`
				Rules []struct {
					Alert       string            `json:"alert"`
					Expr        string            `json:"expr"`
					For         string            `json:"for"`
					Labels      map[string]string `json:"labels"`
					Annotations map[string]string `json:"annotations"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	raw, _ := json.Marshal(v)
	if err := json.Unmarshal(raw, &rule); err != nil || rule.Kind != "PrometheusRule" {
		t.Fatalf("not a PrometheusRule: %v", err)
	}
	known := append(servedNames(t), kubeStateMetrics...)
	alerts := map[string]bool{}
	for _, g := range rule.Spec.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			if r.Alert == "" || strings.TrimSpace(r.Expr) == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %q: want alert, expr, labels.severity and annotations.summary", r.Alert)
			}
			if _, err := time.ParseDuration(r.For); err != nil {
				t.Errorf("rule %s: for %q: %v", r.Alert, r.For, err)
			}
			for _, name := range metricNames(r.Expr) {
				if !slices.Contains(known, name) {
					t.Errorf("rule %s queries %s, which luaop does not serve", r.Alert, name)
				}
			}
		}
	}
	// What the issue asks to alert on: reload failures, handler failures, queue
	// depth, webhook errors.
	// Issue 50: an absent operator, exit status 6, an unreachable webhook, sharding
	// trouble, certificates, stuck Lua states.
	for _, a := range []string{"LuaopScriptsReloadFailed", "LuaopHandlersFailing", "LuaopQueueGrowing", "LuaopWebhookErrors",
		"LuaopAbsent", "LuaopLostStanding", "LuaopWebhookUnreachable", "LuaopShardMembersDisagree", "LuaopCertificateExpiring", "LuaopLuaStatesStuck"} {
		if !alerts[a] {
			t.Errorf("no alert %s", a)
		}
	}
}

// The Grafana dashboard: valid JSON, every panel queries a templated Prometheus data
// source, and only metrics luaop serves.
func TestGrafanaDashboardQueriesLuaopMetrics(t *testing.T) {
	deployDir, _, _ := paths(t)
	data, err := os.ReadFile(filepath.Join(deployDir, "components", "prometheus", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr       string         `json:"expr"`
				Datasource map[string]any `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) < 8 {
		t.Fatalf("dashboard: uid %q, %d panels", dash.UID, len(dash.Panels))
	}
	known := servedNames(t)
	queried := map[string]bool{}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource["uid"] != "${datasource}" {
				t.Errorf("panel %q: data source %v, want the templated ${datasource}", p.Title, tg.Datasource)
			}
			names := metricNames(strings.ReplaceAll(tg.Expr, "$__rate_interval", "5m"))
			if len(names) == 0 {
				t.Errorf("panel %q: %q queries no metric", p.Title, tg.Expr)
			}
			for _, name := range names {
				queried[name] = true
				if !slices.Contains(known, name) {
					t.Errorf("panel %q queries %s, which luaop does not serve", p.Title, name)
				}
			}
		}
	}
	for _, m := range []string{"luaop_scripts_reload_failed", "luaop_handler_runs_total", "luaop_queue_depth", "controller_runtime_webhook_requests_total", "controller_runtime_reconcile_panics_total",
		"controller_runtime_reconcile_time_seconds_bucket", "luaop_webhook_reachable", "luaop_shard_members", "luaop_shard_objects_owned",
		"luaop_certificate_expiry_timestamp_seconds", "luaop_lua_states_stuck"} {
		if !queried[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
}
