package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
)

// The kubelet's liveness check reads the status code: a failed probe must be a 500.
func TestHealthzAnswers500WhenAProbeFails(t *testing.T) {
	tests := []struct {
		name    string
		results map[string]any
		healthy bool
		code    int
	}{
		{"all probes succeed", map[string]any{"db": "ok"}, true, http.StatusOK},
		{"a probe failed", map[string]any{"db": map[string]any{"error": "probe.lua:3: unreachable"}}, false, http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := healthz(func(context.Context) (map[string]any, bool) { return tt.results, tt.healthy })
			rec := httptest.NewRecorder()
			h(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
			if rec.Code != tt.code {
				t.Errorf("status %d, want %d", rec.Code, tt.code)
			}
			if !strings.Contains(rec.Body.String(), `"db"`) {
				t.Errorf("the body lacks the probe's result: %s", rec.Body.String())
			}
		})
	}
}

// Issue 34: a Lua call held past its deadline makes /healthz answer 500, naming it.
func TestHealthzReportsStuckLuaStates(t *testing.T) {
	probe := func(context.Context) (map[string]any, bool) { return map[string]any{"db": "ok"}, true }
	var stuck []luabind.StuckCall
	h := healthz(withStuckStates(probe, func() []luabind.StuckCall { return stuck }))
	get := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec
	}
	if rec := get(); rec.Code != http.StatusOK || strings.Contains(rec.Body.String(), "luaop.lua") {
		t.Fatalf("no stuck call: %d %s", rec.Code, rec.Body.String())
	}
	stuck = []luabind.StuckCall{{What: "slow", Shard: 1, Deadline: time.Now().Add(-3 * time.Second)}}
	rec := get()
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "Lua state 1 is held by slow") || !strings.Contains(rec.Body.String(), `"db"`) {
		t.Fatalf("a stuck call: %d %s", rec.Code, rec.Body.String())
	}
}
