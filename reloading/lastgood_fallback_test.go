package reloading

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/testcluster"
)

// luaop run starting on scripts that do not load falls back on the last good
// scripts kept: what the user sees in each case (the log naming file:line, what
// serves, /readyz's note, the metrics), and that the next good save serves.
func TestFirstLoadFailsLastGoodFallback(t *testing.T) {
	for _, tc := range []struct {
		name     string
		kept     []luabind.Script
		loadErr  error
		serves   string   // the handlers serving after the fallback; "": none
		wantLogs []string // besides the folder's own error
	}{
		{name: "kept scripts load and serve", kept: []luabind.Script{{Name: "a.lua", Source: []byte(handlerScript("kept"))}},
			serves: "kept", wantLogs: []string{"serving the last good scripts", "ops/scripts-last-good", "scripts loaded"}},
		{name: "empty store", wantLogs: []string{"no last good scripts to serve"}},
		{name: "a Load error", loadErr: errors.New("reading ConfigMap ops/scripts-last-good: connection refused"),
			wantLogs: []string{"the last good scripts cannot be read", "connection refused", "no last good scripts to serve"}},
		{name: "kept scripts fail too", kept: []luabind.Script{{Name: "a.lua", Source: []byte("-- kept\n" + brokenScript)}},
			wantLogs: []string{"the last good scripts do not load either", "a.lua:4", "no last good scripts to serve"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newParts(t, false, change("a.lua", brokenScript))
			p.lastGood.stored, p.lastGood.loadErr = tc.kept, tc.loadErr
			served := make(chan bool, 1)
			go func() { served <- p.reloader.First(t.Context()) }()
			if tc.serves != "" {
				if !<-served {
					t.Fatal("First: the last good scripts do not serve")
				}
			} else {
				testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
					return strings.Contains(p.logs.String(), "no last good scripts to serve"), p.logs.String()
				})
			}
			for _, want := range append([]string{"the scripts do not load", "a.lua:3"}, tc.wantLogs...) {
				if !strings.Contains(p.logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, p.logs.String())
				}
			}
			if got := p.op.handlers(); got != tc.serves {
				t.Errorf("serving %q, want %q", got, tc.serves)
			}
			notes, lastGood, _, _ := p.op.snapshot()
			wantLastGood := []bool(nil)
			if tc.serves != "" {
				wantLastGood = []bool{true}
			}
			if len(notes) != 1 || notes[0].err == nil || !strings.Contains(notes[0].err.Error(), "a.lua:3") || !slices.Equal(lastGood, wantLastGood) {
				t.Errorf("operator notes %+v, serving the last good %v; want the folder's error at a.lua:3, %v", notes, lastGood, wantLastGood)
			}
			// The folder's load is counted, failed; the fallback's is no reload of it.
			if reloads, _ := p.metrics.snapshot(t); !slices.Equal(reloads, []bool{false}) {
				t.Errorf("reloads counted %v, want [false]", reloads)
			}

			if tc.serves != "" {
				// A broken save meanwhile: the last good scripts keep running.
				p.run(t)
				p.changes <- change("a.lua", "-- still\n"+brokenScript)
				testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
					return strings.Contains(p.logs.String(), "reload failed; the previous scripts keep running"), p.logs.String()
				})
				if !strings.Contains(p.logs.String(), "a.lua:4") || p.op.handlers() != tc.serves {
					t.Errorf("after a broken save serving %q, log:\n%s", p.op.handlers(), p.logs.String())
				}
			}
			p.changes <- change("a.lua", handlerScript("fixed"))
			if tc.serves == "" && !<-served {
				t.Fatal("First: no scripts serving after the fix")
			}
			// The folder's scripts serve again, and /readyz says so.
			testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
				_, lastGood, _, _ := p.op.snapshot()
				return p.op.handlers() == "fixed" && len(lastGood) > 0 && !lastGood[len(lastGood)-1], fmt.Sprint(p.op.handlers(), lastGood)
			})
		})
	}
}
