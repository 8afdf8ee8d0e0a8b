package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/testcluster"
)

// Shell completion (luaop completion bash|zsh|fish|powershell) of flag values,
// folders, kubeconfig contexts and test cases, through cobra's __complete as the
// shells call it.
func TestShellCompletion(t *testing.T) {
	examples := filepath.Join(testcluster.RepoRoot(), "scripts", "examples")
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\ncontexts:\n- name: kind-dev\n  context: {cluster: c, user: u}\n- name: prod\n  context: {cluster: c, user: u}\ncurrent-context: kind-dev\nusers:\n- name: u\n  user: {token: x}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--log-format", ""}, []string{"plain", "json"}},
		{[]string{"dev", "--lifecycle", ""}, []string{"asap", "one-by-one", "all-at-once"}},
		{[]string{"check", "--format", ""}, []string{"text", "json", "sarif"}},
		{[]string{"test", "--format", ""}, []string{"text", "junit", "json"}},
		{[]string{"run", "--kubeconfig", kubeconfig, "--context", ""}, []string{"kind-dev", "prod"}},
		{[]string{"test", examples, "--run", ""}, []string{`^widgets\.yaml/greets a new widget$`}},
		{[]string{"check", ""}, []string{":16"}}, // ShellCompDirectiveFilterDirs
		{[]string{""}, []string{"completion", "init", "run", "test"}},
	} {
		out, _, err := runCLI(t, append([]string{"__complete"}, tt.args...)...)
		if err != nil {
			t.Errorf("__complete %v: %v", tt.args, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(out, w) {
				t.Errorf("__complete %q: %q lacks %q", tt.args, out, w)
			}
		}
	}
}
