package devloop

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/reloading"
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

// What a developer reads in `luaop dev`: the handlers with where they are defined,
// every reload's outcome, and a broken save's file:line with what to do next.
func TestViewShowsHandlersReloadsAndBrokenSaves(t *testing.T) {
	var out bytes.Buffer
	v := NewView(&out, slog.LevelInfo) // not a terminal: plain text
	widgets := causes.Resource{GroupVersionResource: schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}}
	v.Loaded("scripts/examples", luabind.LoadReport{
		Files: []string{"widgets.lua"},
		Handlers: []causes.Spec{
			{ID: "widgets_create", Kind: causes.KindChange, Resource: widgets, Source: "widgets.lua:3"},
			{ID: "ready", Kind: causes.KindStartup, Source: "widgets.lua:9"},
		},
	})
	v.Reloaded(reloading.Event{Files: []string{"widgets.lua"}, Latency: 42 * time.Millisecond,
		Report: luabind.LoadReport{Handlers: make([]causes.Spec, 2)}})
	v.Reloaded(reloading.Event{Files: []string{"widgets.lua"},
		Err: errors.New("widgets.lua:7: '=' expected near 'end'")})
	v.Reloaded(reloading.Event{Files: []string{"broken.lua"}, NothingServes: true,
		Err: errors.New("broken.lua:2: unexpected symbol")})
	slog.New(v.Handler()).Info("handler succeeded", "namespace", "default", "name", "w1", "handler", "widgets_create")
	slog.New(v.Handler()).Debug("below the level")

	text := out.String()
	for _, want := range []string{
		"1 script(s), 2 handler(s)",
		"widgets_create", "widgets.lua:3", "(operator)", // a hook has no resource
		"✔ reloaded widgets.lua in 42ms (2 handlers)",
		"✘ reload failed widgets.lua", "widgets.lua:7: '=' expected near 'end'",
		"the previous scripts keep running; fix the file and save again",
		"✘ the scripts do not load broken.lua", "no scripts serve yet; fix the file and save again",
		"handler succeeded", "default/w1",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the view lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "below the level") || strings.Contains(text, "\x1b[") {
		t.Errorf("debug lines or colour codes in a plain view:\n%s", text)
	}
}
