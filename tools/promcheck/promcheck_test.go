package promcheck

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

// The PrometheusRule's groups parse as promtool check rules parses a rule file:
// known fields only, valid durations, label and annotation names, templates, and
// every expression valid PromQL.
func TestPrometheusRuleParsesAsPromtoolDoes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "components", "prometheus", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		Spec yaml.Node `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	groups, err := yaml.Marshal(&obj.Spec) // a rule file is the spec: groups: [...]
	if err != nil {
		t.Fatal(err)
	}
	rgs, errs := rulefmt.Parse(groups, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, e := range errs {
		t.Errorf("prometheusrule.yaml: %v", e)
	}
	if len(errs) == 0 && (rgs == nil || len(rgs.Groups) == 0 || len(rgs.Groups[0].Rules) == 0) {
		t.Error("prometheusrule.yaml has no rules")
	}
}
