package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/leader"
	"github.com/luaop/luaop/sharding"
	"github.com/luaop/luaop/testcluster"
)

// The exit statuses CI and scripts tell failures apart by (README "Exit statuses").
func TestExitCodes(t *testing.T) {
	examples := filepath.Join(testcluster.RepoRoot(), "scripts", "examples")
	broken := t.TempDir()
	if err := os.WriteFile(filepath.Join(broken, "a.lua"), []byte("local n = 7 // 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	failing := t.TempDir()
	if err := os.WriteFile(filepath.Join(failing, "a.lua"), []byte("local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx) return 1 end, {id = 'one'})\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(failing, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(failing, "tests", "t.yaml"), []byte("cases:\n- name: wrong\n  handler: one\n  object: {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n  expect: {result: 2}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	malformed := t.TempDir()
	if err := os.MkdirAll(filepath.Join(malformed, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(malformed, "tests", "t.yaml"), []byte("cases:\n- name: typo\n  handlr: one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unreachable := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(unreachable, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"ok", []string{"check", examples}, exitOK, ""},
		{"unknown flag", []string{"check", "--nope", examples}, exitUsage, "unknown flag: --nope"},
		{"missing argument", []string{"check"}, exitUsage, "accepts 1 arg(s), received 0"},
		{"unknown command", []string{"chek"}, exitUsage, "unknown command"},
		{"--config where it means nothing", []string{"check", "--config", "luaop.yaml", examples}, exitUsage, "luaop check reads no config file"},
		{"a config file that does not exist", []string{"run", "--config", filepath.Join(t.TempDir(), "missing.yaml"), examples}, exitUsage, "missing.yaml"},
		{"an invalid setting", []string{"run", "--workers", "0", examples}, exitUsage, "invalid --workers=0"},
		{"rbac of a folder that does not exist", []string{"rbac", filepath.Join(broken, "nope")}, exitUsage, "is not a folder of Lua scripts"},
		{"check of a folder that does not exist", []string{"check", filepath.Join(broken, "nope")}, exitUsage, "is not a folder of Lua scripts"},
		{"test of a folder that does not exist", []string{"test", filepath.Join(broken, "nope")}, exitUsage, "no test files"},
		{"init without a folder", []string{"init"}, exitUsage, "accepts 1 arg(s), received 0"},
		{"stubs with an argument", []string{"stubs", "extra"}, exitUsage, `unknown command "extra"`},
		{"status of an operator that does not answer", []string{"status", "--address", "127.0.0.1:1"}, exitError, "is the operator running"},
		{"problems found", []string{"check", broken}, exitProblems, "1 problem(s)"},
		{"tests failed", []string{"test", failing}, exitTestsFailed, ""},
		{"a test file with an unknown key", []string{"test", malformed}, exitUsage, `t.yaml:3: unknown key "handlr"`},
		{"a test file with an unknown key, junit", []string{"test", "--format", "junit", malformed}, exitUsage, `t.yaml:3: unknown key "handlr"`},
		{"--run matches nothing", []string{"test", "--run", "nomatch", failing}, exitUsage, `no case matches --run "nomatch"`},
		{"cluster unreachable", []string{"run", "--kubeconfig", unreachable, "--health-address=", "--metrics-address=", examples}, exitUnreachable, "cannot be reached"},
		{"release without what to release", []string{"release"}, exitUsage, "give the scripts' folder"},
		{"webhooks remove, cluster unreachable", []string{"webhooks", "remove", "--kubeconfig", unreachable}, exitUnreachable, "cannot be reached"},
		{"-v 6 is a verbosity, not an argument", []string{"check", "-v", "6", examples}, exitOK, ""},
		{"-v alone", []string{"test", "-v", examples}, exitOK, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			root := newRootCommand()
			root.SetOut(&bytes.Buffer{})
			root.SetErr(&stderr)
			code := executeWith(t.Context(), root, tt.args, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("luaop %s: exit %d, stderr %q; want %d and %q", strings.Join(tt.args, " "), code, stderr.String(), tt.code, tt.stderr)
			}
		})
	}
}

// A replica that lost its standing exits with a status of its own, not a crash's
// (the e2e's supervisor and a Deployment's alert tell the two apart by it).
func TestExitCodeOfALostStanding(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code int
	}{
		{fmt.Errorf("running: %w", sharding.ErrMembershipLost), exitStandingLost},
		{errors.Join(leader.ErrLeadershipLost, errors.New("lead: context canceled")), exitStandingLost},
		{errors.New("sharding: membership lost, in words only"), exitError},
		{unreachableError(fmt.Errorf("x: %w", sharding.ErrMembershipLost)), exitUnreachable},
	} {
		if got := exitCode(tt.err); got != tt.code {
			t.Errorf("exitCode(%v) = %d, want %d", tt.err, got, tt.code)
		}
	}
}
