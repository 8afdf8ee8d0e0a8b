package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/devloop"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/reloading"
)

// nowhere is a rest.Config nothing answers: the parts built on it are only
// constructed here, never started.
var nowhere = &rest.Config{Host: "https://127.0.0.1:1"}

const scriptsWithAdmission = `local luaop = require("luaop")
luaop.on.create("example.com/v1/widgets", function() end, {id = "create"})
luaop.on.validate("example.com/v1/widgets", function(ctx) end, {id = "check"})
`

// A part the process lacks is left out of the reload's options as a nil
// interface, not as a typed nil pointer the Reloader would then call (a panic on
// the first load); a part it has is passed on.
func TestReloadOptionsLeaveOutWhatTheProcessLacks(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	op, err := operator.New(nowhere, operator.Options{Scripts: []luabind.Script{{Name: "a.lua", Source: []byte(scriptsWithAdmission)}}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { op.Runtime().Close() })

	none := reloadOptions(settings{}, "scripts", op, nil, nil, nil, nil, nil, nil, log)
	if none.Operator == nil || none.Dir != "scripts" {
		t.Errorf("the operator or folder lost: %+v", none)
	}
	for name, part := range map[string]any{"Metrics": none.Metrics, "Webhooks": none.Webhooks, "Peering": none.Peering, "LastGood": none.LastGood, "View": none.View} {
		if part != nil {
			t.Errorf("%s = %#v without that part: want a nil interface", name, part)
		}
	}

	store := reloading.NewLastGoodStore(fake.NewSimpleClientset(), "ops", "last-good", "luaop.dev", false, log)
	view := devloop.NewView(io.Discard, slog.LevelInfo)
	m := metrics.New()
	all := reloadOptions(settings{}, "scripts", op, m, nil, nil, nil, store, view, log)
	if all.Metrics != reloading.Metrics(m) {
		t.Errorf("Metrics = %#v, want the process's", all.Metrics)
	}
	if all.LastGood != reloading.LastGood(store) {
		t.Errorf("LastGood = %#v, want the store", all.LastGood)
	}
	if dv, ok := all.View.(devView); !ok || dv.view != view || dv.webhooks != nil || dv.rt != op.Runtime() {
		t.Errorf("View = %#v, want the dev view over the operator's runtime, without webhooks", all.View)
	}
}

// The dev view as the reload shows itself: the scripts, then, when there are
// webhooks and the scripts have admission handlers, where the API server is to
// call them; a failed reload shows its error and no webhooks line.
func TestDevViewNotesTheWebhooksAfterALoad(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt := luabind.New(luabind.Options{Shards: 1, Logger: log})
	t.Cleanup(rt.Close)
	report, err := rt.Load(t.Context(), []luabind.Script{{Name: "a.lua", Source: []byte(scriptsWithAdmission)}})
	if err != nil {
		t.Fatal(err)
	}
	webhooks, err := admission.New(nowhere, rt, admission.Options{Address: "127.0.0.1:0", URL: "https://127.0.0.1:9443", DryRun: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	const note = "webhooks: dry run: the webhook configurations are not written"
	for _, tc := range []struct {
		name     string
		webhooks *admission.Webhooks
		show     func(devView)
		want     []string
		wantNot  []string
	}{
		{"first scripts, with webhooks", webhooks, func(d devView) { d.Loaded("scripts", report) }, []string{"a.lua", note}, nil},
		{"first scripts, no webhooks", nil, func(d devView) { d.Loaded("scripts", report) }, []string{"a.lua"}, []string{"webhooks:"}},
		{"a reload", webhooks, func(d devView) { d.Reloaded(reloading.Event{Files: []string{"a.lua"}, Report: report}) }, []string{"reloaded a.lua", note}, nil},
		{"a failed reload", webhooks, func(d devView) {
			d.Reloaded(reloading.Event{Files: []string{"a.lua"}, Err: errors.New("a.lua:3: unexpected symbol")})
		}, []string{"reload failed", "a.lua:3: unexpected symbol", "the previous scripts keep running"}, []string{"webhooks:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			tc.show(devView{view: devloop.NewView(&out, slog.LevelInfo), webhooks: tc.webhooks, rt: rt})
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("the view shows\n%s\nwithout %q", out.String(), w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out.String(), w) {
					t.Errorf("the view shows\n%s\nwith %q", out.String(), w)
				}
			}
		})
	}
}
