package devloop

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// The dev view shows an object as namespace/name, whatever fields the log line
// keeps apart for JSON logs, and every success.
func TestViewShowsObjectsAsNamespaceAndName(t *testing.T) {
	tests := []struct {
		name  string
		attrs []any
		want  string
		not   []string
	}{
		{"namespaced", []any{"resource", "examples.luaop.dev/v1/widgets", "kind", "Widget", "namespace", "default", "name", "w1", "uid", "u-1", "handler", "greet", "reason", "create"},
			" default/w1 greet ✔ handler succeeded reason=create", []string{"uid=", "kind=", "namespace="}},
		{"cluster-scoped", []any{"resource", "v1/namespaces", "kind", "Namespace", "name", "team-a", "handler", "label"},
			" team-a label ✔ handler succeeded", []string{"name="}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			v := NewView(&out, slog.LevelInfo)
			slog.New(v.Handler()).Info("handler succeeded", tt.attrs...)
			if !strings.Contains(out.String(), tt.want) {
				t.Errorf("view line %q lacks %q", out.String(), tt.want)
			}
			for _, n := range tt.not {
				if strings.Contains(out.String(), n) {
					t.Errorf("view line %q shows %s", out.String(), n)
				}
			}
		})
	}
}
