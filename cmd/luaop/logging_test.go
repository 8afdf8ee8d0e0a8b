package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// klog's logger is set before any test's client runs (as main does first).
func init() { installKlog() }

// client-go's klog lines come out in the operator's format (JSON in luaop run), and
// -v N decides which of klog's V(N) lines are written, as in kubectl.
func TestKlogGoesToTheOperatorsLog(t *testing.T) {
	t.Cleanup(func() { routeKlog(slog.New(slog.NewTextHandler(io.Discard, nil)), 0) })
	var buf bytes.Buffer
	s := settings{LogLevel: "info", LogFormat: "json", Verbosity: 6}
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: logLevel(s)}))
	routeKlog(log, s.Verbosity)
	klog.InfoS("from client-go", "host", "api")
	klog.V(6).InfoS("a request URL")
	klog.V(8).InfoS("a request body")
	klog.Flush()
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("a klog line is not the operator's JSON: %q", line)
		}
		msgs = append(msgs, rec["msg"].(string))
	}
	if got := strings.Join(msgs, "|"); got != "from client-go|a request URL" {
		t.Errorf("klog lines %q, want the info one and V(6) (not V(8))", got)
	}
	if logLevel(settings{LogLevel: "info", Verbosity: 2}) != slog.Level(-2) || logLevel(settings{LogLevel: "warn"}) != slog.LevelWarn {
		t.Error("-v 2 keeps klog's V(2) lines (slog level -2); no -v keeps --log-level")
	}
}

// kubectl's -v N and kopf's -v and --debug.
func TestVerbosityFlags(t *testing.T) {
	for _, tt := range []struct {
		args      []string
		level     string
		verbosity int
	}{
		{[]string{"-v"}, "debug", 4},
		{[]string{"-v", "6"}, "debug", 6},
		{[]string{"-v=2"}, "info", 2},
		{[]string{"--verbose", "8"}, "debug", 8},
		{[]string{"--debug"}, "debug", 6},
		{nil, "info", 0},
	} {
		s, err := execSettings(t, newRunCommand, loadSettings, normalizeArgs(append(append([]string{"run"}, tt.args...), "dir"))...)
		if err != nil {
			t.Errorf("%v: %v", tt.args, err)
			continue
		}
		if s.LogLevel != tt.level || s.Verbosity != tt.verbosity {
			t.Errorf("%v: level %s verbosity %d, want %s %d", tt.args, s.LogLevel, s.Verbosity, tt.level, tt.verbosity)
		}
	}
}
