package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
)

// Every setting comes from a flag, an LUAOP_* variable or the config file, in that
// order of precedence, with the documented default otherwise.
func TestSettingsPrecedence(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "luaop.yaml")
	if err := os.WriteFile(config, []byte("workers: 7\nprefix: from-file.example\nlog-level: debug\nnamespaces: [a, b]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	verboseConfig := filepath.Join(dir, "verbose.yaml")
	if err := os.WriteFile(verboseConfig, []byte("verbose: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, s settings)
	}{
		{"defaults", nil, nil, func(t *testing.T, s settings) {
			if s.Workers != 16 || s.Prefix != "luaop.dev" || s.LogFormat != "json" || s.HandlerTimeout != 30*time.Second || s.LuaMemoryBudget != 0 || s.ProgressStorage != "auto" || s.DiffBaseStorage != "auto" {
				t.Errorf("defaults: %+v", s)
			}
		}},
		{"config file", []string{"--config", config}, nil, func(t *testing.T, s settings) {
			if s.Workers != 7 || s.Prefix != "from-file.example" || s.LogLevel != "debug" || strings.Join(s.Namespaces, ",") != "a,b" {
				t.Errorf("from the file: %+v", s)
			}
		}},
		{"environment over file", []string{"--config", config}, map[string]string{"LUAOP_WORKERS": "9", "LUAOP_HANDLER_TIMEOUT": "2s"}, func(t *testing.T, s settings) {
			if s.Workers != 9 || s.HandlerTimeout != 2*time.Second || s.Prefix != "from-file.example" {
				t.Errorf("env over file: %+v", s)
			}
		}},
		{"flag over environment", []string{"--config", config, "--workers", "3"}, map[string]string{"LUAOP_WORKERS": "9"}, func(t *testing.T, s settings) {
			if s.Workers != 3 {
				t.Errorf("flag over env: workers = %d", s.Workers)
			}
		}},
		{"lua memory budget", []string{"--lua-memory-budget", "512Mi"}, nil, func(t *testing.T, s settings) {
			if s.LuaMemoryBudget != 512<<20 {
				t.Errorf("--lua-memory-budget=512Mi: %d", s.LuaMemoryBudget)
			}
		}},
		{"lua memory budget off and auto", nil, map[string]string{"LUAOP_LUA_MEMORY_BUDGET": "off"}, func(t *testing.T, s settings) {
			if s.LuaMemoryBudget != -1 {
				t.Errorf("LUAOP_LUA_MEMORY_BUDGET=off: %d", s.LuaMemoryBudget)
			}
		}},
		{"LUAOP_CONFIG names the config file", nil, map[string]string{"LUAOP_CONFIG": config}, func(t *testing.T, s settings) {
			if s.Workers != 7 || s.Prefix != "from-file.example" {
				t.Errorf("LUAOP_CONFIG ignored: %+v", s)
			}
		}},
		{"lists in the environment are split at commas", nil, map[string]string{"LUAOP_NAMESPACES": "a, b,team-*"}, func(t *testing.T, s settings) {
			if strings.Join(s.Namespaces, "|") != "a|b|team-*" {
				t.Errorf("LUAOP_NAMESPACES=a, b,team-*: namespaces %q, want [a b team-*]", s.Namespaces)
			}
		}},
		{"-n is repeatable, --namespace is -n", []string{"-n", "a", "--namespace", "b", "--namespaces", "c,d"}, nil, func(t *testing.T, s settings) {
			if strings.Join(s.Namespaces, "|") != "a|b|c|d" {
				t.Errorf("namespaces %q, want [a b c d]", s.Namespaces)
			}
		}},
		{"-A clears namespaces of the file and the environment", []string{"--config", config, "-A"}, map[string]string{"LUAOP_NAMESPACES": "x"}, func(t *testing.T, s settings) {
			if len(s.Namespaces) != 0 {
				t.Errorf("-A: namespaces %q, want none (cluster-wide)", s.Namespaces)
			}
		}},
		{"-v is debug", []string{"-v"}, nil, func(t *testing.T, s settings) {
			if s.LogLevel != "debug" {
				t.Errorf("-v: log level %q", s.LogLevel)
			}
		}},
		{"--quiet is warn, over the file's level", []string{"--config", config, "--quiet"}, nil, func(t *testing.T, s settings) {
			if s.LogLevel != "warn" {
				t.Errorf("--quiet: log level %q", s.LogLevel)
			}
		}},
		{"LUAOP_VERBOSE=true", nil, map[string]string{"LUAOP_VERBOSE": "true"}, func(t *testing.T, s settings) {
			if s.LogLevel != "debug" {
				t.Errorf("LUAOP_VERBOSE=true: log level %q", s.LogLevel)
			}
		}},
		{"warning is warn", []string{"--log-level", "WARNING"}, nil, func(t *testing.T, s settings) {
			if s.LogLevel != "warn" {
				t.Errorf("--log-level WARNING: log level %q", s.LogLevel)
			}
		}},
		// flag > LUAOP_* > file > default: the higher source wins.
		{"--log-level over LUAOP_VERBOSE", []string{"--log-level", "error"}, map[string]string{"LUAOP_VERBOSE": "true"}, func(t *testing.T, s settings) {
			if s.LogLevel != "error" {
				t.Errorf("LUAOP_VERBOSE=true --log-level error: log level %q, want error", s.LogLevel)
			}
		}},
		{"-v over the file's log level", []string{"--config", config, "-v"}, nil, func(t *testing.T, s settings) {
			if s.LogLevel != "debug" {
				t.Errorf("-v with log-level: debug in the file: log level %q", s.LogLevel)
			}
		}},
		{"LUAOP_LOG_LEVEL over the file's verbose", []string{"--config", verboseConfig}, map[string]string{"LUAOP_LOG_LEVEL": "error"}, func(t *testing.T, s settings) {
			if s.LogLevel != "error" {
				t.Errorf("LUAOP_LOG_LEVEL=error with verbose: true in the file: log level %q", s.LogLevel)
			}
		}},
		{"LUAOP_QUIET over the file's verbose", []string{"--config", verboseConfig}, map[string]string{"LUAOP_QUIET": "true"}, func(t *testing.T, s settings) {
			if s.LogLevel != "warn" {
				t.Errorf("LUAOP_QUIET=true with verbose: true in the file: log level %q", s.LogLevel)
			}
		}},
		{"-n over LUAOP_ALL_NAMESPACES", []string{"-n", "a"}, map[string]string{"LUAOP_ALL_NAMESPACES": "true"}, func(t *testing.T, s settings) {
			if strings.Join(s.Namespaces, ",") != "a" {
				t.Errorf("LUAOP_ALL_NAMESPACES=true -n a: namespaces %q, want [a]", s.Namespaces)
			}
		}},
		{"LUAOP_ALL_NAMESPACES over the file's namespaces", []string{"--config", config}, map[string]string{"LUAOP_ALL_NAMESPACES": "true"}, func(t *testing.T, s settings) {
			if len(s.Namespaces) != 0 {
				t.Errorf("LUAOP_ALL_NAMESPACES=true with namespaces in the file: %q, want none", s.Namespaces)
			}
		}},
		{"zero where zero means something", []string{"--shards", "0", "--probe-cache", "0", "--health-address", ""}, nil, func(t *testing.T, s settings) {
			if s.Shards != 0 || s.ProbeCache != 0 || s.HealthAddress != "" {
				t.Errorf("zeros: %+v", s)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			s, err := parseSettings(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s)
		})
	}
}

// parseSettings reads the settings of `luaop run ARGS...` in the test's environment.
func parseSettings(t *testing.T, args ...string) (settings, error) {
	t.Helper()
	v := viper.New()
	cmd := newRunCommand(v)
	cmd.Flags().String("config", "", "")
	if err := cmd.ParseFlags(args); err != nil {
		return settings{}, err
	}
	return loadSettings(cmd, v)
}

// Every setting refuses what it cannot use, naming where the value came from (flag,
// variable or config file) and what is allowed, instead of replacing it silently.
func TestSettingsRejectBadValues(t *testing.T) {
	dir := t.TempDir()
	files := 0
	file := func(content string) string {
		files++
		p := filepath.Join(dir, fmt.Sprintf("c%d.yaml", files))
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		args []string
		env  map[string]string
		want []string // substrings of the error
	}{
		{[]string{"--workers", "0"}, nil, []string{"--workers=0", "at least 1"}},
		{[]string{"--workers", "-2"}, nil, []string{"--workers=-2", "at least 1"}},
		{nil, map[string]string{"LUAOP_WORKERS": "many"}, []string{`LUAOP_WORKERS="many"`, "whole number"}},
		{[]string{"--shards", "-3"}, nil, []string{"--shards=-3", "at least 0"}},
		{[]string{"--shard-lease-duration", "1500ms"}, nil, []string{"--shard-lease-duration", "whole number of seconds, at least 2s"}},
		{nil, map[string]string{"LUAOP_SHARD_GROUP": "Not_A_Name"}, []string{"LUAOP_SHARD_GROUP"}},
		{[]string{"--handler-timeout", "0s"}, nil, []string{"--handler-timeout", "greater than 0"}},
		{[]string{"--lua-memory-budget", "lots"}, nil, []string{"--lua-memory-budget", "auto, off or a size of at least 16Mi"}},
		{nil, map[string]string{"LUAOP_LUA_MEMORY_BUDGET": "1Ki"}, []string{`LUAOP_LUA_MEMORY_BUDGET="1Ki"`, "at least 16Mi"}},
		{nil, map[string]string{"LUAOP_HANDLER_TIMEOUT": "30"}, []string{`LUAOP_HANDLER_TIMEOUT="30"`, "with a unit"}},
		{nil, map[string]string{"LUAOP_HANDLER_TIMEOUT": "soon"}, []string{`LUAOP_HANDLER_TIMEOUT="soon"`, "with a unit"}},
		{[]string{"--consistency-timeout", "0s"}, nil, []string{"--consistency-timeout", "greater than 0"}},
		{[]string{"--shutdown-grace-period", "-1s"}, nil, []string{"--shutdown-grace-period", "greater than 0"}},
		{[]string{"--probe-cache", "-1s"}, nil, []string{"--probe-cache", "0 or more"}},
		{[]string{"--reload-debounce", "0s"}, nil, []string{"--reload-debounce", "greater than 0"}},
		{nil, map[string]string{"LUAOP_RELOAD_DEBOUNCE": "20"}, []string{`LUAOP_RELOAD_DEBOUNCE="20"`, "with a unit"}},
		{[]string{"--log-level", "verbose"}, nil, []string{`--log-level="verbose"`, "debug, info, warn or error"}},
		{[]string{"--log-format", "xml"}, nil, []string{`--log-format="xml"`, "plain or json"}},
		{[]string{"--log-events-level", "loud"}, nil, []string{"--log-events-level", "debug, info, warning, error or none"}},
		{[]string{"--progress-storage", "etcd"}, nil, []string{`--progress-storage="etcd"`, "auto, annotations or status"}},
		{nil, map[string]string{"LUAOP_DIFFBASE_STORAGE": "disk"}, []string{`LUAOP_DIFFBASE_STORAGE="disk"`, "auto, annotations or status"}},
		{[]string{"--lifecycle", "random"}, nil, []string{`--lifecycle="random"`, "asap, one-by-one, all-at-once, randomized or shuffled"}},
		{[]string{"--prefix", "My_Prefix"}, nil, []string{`--prefix="My_Prefix"`, "DNS subdomain"}},
		{[]string{"--prefix", ""}, nil, []string{`--prefix=""`, "DNS subdomain"}},
		{[]string{"--health-address", "8080"}, nil, []string{`--health-address="8080"`, "host:port"}},
		{[]string{"--health-address", ":http"}, nil, []string{`--health-address=":http"`, "host:port"}},
		{[]string{"--leader-election-name", "Not A Name"}, nil, []string{"--leader-election-name", "object name"}},
		{[]string{"--leader-election-namespace", "Ops"}, nil, []string{"--leader-election-namespace", "object name"}},
		{nil, map[string]string{"LUAOP_POST_EVENTS": "sometimes"}, []string{`LUAOP_POST_EVENTS="sometimes"`, "true or false"}},
		{nil, map[string]string{"LUAOP_DRY_RUN": "yes please"}, []string{"LUAOP_DRY_RUN", "true or false"}},
		{nil, map[string]string{"LUAOP_LEADER_ELECT": "2"}, []string{"LUAOP_LEADER_ELECT", "true or false"}},
		{[]string{"-n", "Team-A"}, nil, []string{`--namespaces="Team-A"`, "namespace names"}},
		{[]string{"-n", "team-["}, nil, []string{`--namespaces="team-["`, "globs"}},
		{[]string{"-n", "!"}, nil, []string{`--namespaces="!"`, "exclusions"}},
		{[]string{"-v", "-q"}, nil, []string{"--verbose=4 and --quiet=true: give one of them"}},
		{[]string{"-v", "--log-level", "info"}, nil, []string{`--log-level="info" and --verbose=4: give one of them`}},
		{nil, map[string]string{"LUAOP_VERBOSE": "true", "LUAOP_LOG_LEVEL": "error"}, []string{`LUAOP_LOG_LEVEL="error" and LUAOP_VERBOSE=true: give one of them`}},
		{[]string{"-A", "-n", "a"}, nil, []string{`--all-namespaces=true and --namespaces="a": give one of them`}},
		{[]string{"--config", file("all-namespaces: true\nnamespaces: [a]\n")}, nil, []string{"all-namespaces: true in ", `namespaces: "a" in `, "give one of them"}},
		{[]string{"--config", file("workers: 0\nshards: -1\n")}, nil, []string{"workers: 0 in ", "shards: -1 in ", "at least 1", "at least 0"}},
		{[]string{"--config", file("handler-timeout: 30\n")}, nil, []string{"handler-timeout: 30 in ", "a number alone has no unit"}},
		// Numbers of a config file out of an int's range, or not whole: refused with
		// the value as written (a conversion out of range is not defined by Go).
		{[]string{"--config", file("workers: 1e300\n")}, nil, []string{"workers: 1e+300 in ", "whole number"}},
		{[]string{"--config", file("workers: 2.5\n")}, nil, []string{"workers: 2.5 in ", "whole number"}},
		{[]string{"--config", file("kube-api-burst: .inf\n")}, nil, []string{"kube-api-burst: +Inf in ", "whole number"}},
		{[]string{"--config", file("verbose: 1e300\n")}, nil, []string{"verbose: 1e+300 in ", "whole number"}},
		{[]string{"--config", file("namespaces: {a: b}\n")}, nil, []string{"namespaces: map[a:b] in ", "list of strings"}},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, nil, []string{"reading the config file", "missing.yaml"}},
		{nil, map[string]string{"LUAOP_CONFIG": file("log_levle: debug\nnamespace: [a]\nworker: 2\nbogus: 1\n")}, []string{
			`unknown key "log_levle": did you mean "log-level"?`,
			`unknown key "namespace": did you mean "namespaces"?`,
			`unknown key "worker": did you mean "workers"?`,
			`unknown key "bogus"`,
			"are its flags: all-namespaces, allow-context, consistency-timeout"}},
		{[]string{"--config", file("config: other.yaml\n")}, nil, []string{`unknown key "config"`}},
	}
	for _, tt := range tests {
		name := strings.Join(tt.args, " ")
		for k, v := range tt.env {
			name += " " + k + "=" + v
		}
		t.Run(name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			_, err := parseSettings(t, tt.args...)
			if err == nil {
				t.Fatalf("no error; want one naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "bogus") && strings.Contains(err.Error(), `"bogus": did you mean`) {
				t.Errorf("error %q suggests a key for bogus; nothing is near it", err)
			}
		})
	}
}

// KUBECONFIG is a list of files merged as kubectl merges them; --context picks
// another context; --kubeconfig names one file.
func TestKubeconfigLoadingRules(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	clusters := write("clusters", `apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://one.example:6443"}
- name: two
  cluster: {server: "https://two.example:6443"}
users:
- name: me
  user: {token: t}
`)
	contexts := write("contexts", `apiVersion: v1
kind: Config
current-context: first
contexts:
- name: first
  context: {cluster: one, user: me}
- name: second
  context: {cluster: two, user: me}
`)
	alone := write("alone", `apiVersion: v1
kind: Config
current-context: c
clusters: [{name: c, cluster: {server: "https://alone.example"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
`)
	list := strings.Join([]string{clusters, filepath.Join(dir, "absent"), contexts}, string(os.PathListSeparator))
	for _, tt := range []struct {
		env  string
		args []string
		want string
	}{
		{list, nil, "https://one.example:6443"},
		{list, []string{"--context", "second"}, "https://two.example:6443"},
		{list, []string{"--kubeconfig", alone}, "https://alone.example"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			t.Setenv("KUBECONFIG", tt.env)
			s, err := parseSettings(t, tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := restConfig(s)
			if err != nil {
				t.Fatalf("KUBECONFIG=%s %v: %v", tt.env, tt.args, err)
			}
			if cfg.Host != tt.want {
				t.Errorf("KUBECONFIG=%s %v: server %s, want %s", tt.env, tt.args, cfg.Host, tt.want)
			}
		})
	}
}

// A LUAOP_* variable that looks like a misspelled setting is named with the right one
// (viper ignores it); the tools' own variables are not.
func TestSettingsWarnAboutMisspelledVariables(t *testing.T) {
	t.Setenv("LUAOP_WORKRES", "3")
	t.Setenv("LUAOP_NAMESPACE", "a")
	t.Setenv("LUAOP_TEST_KUBECONFIG", "/somewhere")
	t.Setenv("LUAOP_CACHE", "/cache")
	s, err := parseSettings(t)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(s.Warnings, "\n")
	for _, want := range []string{"LUAOP_WORKRES is not a setting of luaop run and is ignored: did you mean LUAOP_WORKERS?",
		"LUAOP_NAMESPACE is not a setting of luaop run and is ignored: did you mean LUAOP_NAMESPACES?"} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings %q lack %q", s.Warnings, want)
		}
	}
	if len(s.Warnings) != 2 {
		t.Errorf("warnings %q: want exactly the two misspellings", s.Warnings)
	}
}

// The config file the README shows is read as it says.
func TestReadmeConfigExample(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```yaml\n# luaop.yaml")
	if !ok {
		t.Fatal("README.md has no luaop.yaml example")
	}
	block, _, _ = strings.Cut("# luaop.yaml"+block, "```")
	file := filepath.Join(t.TempDir(), "luaop.yaml")
	if err := os.WriteFile(file, []byte(block), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := parseSettings(t, "--config", file)
	if err != nil {
		t.Fatalf("the README's config file: %v", err)
	}
	if strings.Join(s.Namespaces, " ") != "team-a team-* !team-tmp" || s.Workers != 32 || s.LogLevel != "debug" || s.HandlerTimeout != time.Minute {
		t.Errorf("the README's config file read as %+v", s)
	}
}
