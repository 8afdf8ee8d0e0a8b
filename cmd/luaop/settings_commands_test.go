package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

// execSettings runs `luaop ARGS...` as main does (root.Execute) with the command's
// RunE replaced by one that only reads the settings, and returns them.
func execSettings(t *testing.T, newCmd func(*viper.Viper) *cobra.Command, read func(*cobra.Command, *viper.Viper) (settings, error), args ...string) (settings, error) {
	t.Helper()
	v := viper.New()
	root := &cobra.Command{Use: "luaop", SilenceUsage: true, SilenceErrors: true}
	root.PersistentFlags().String("config", "", "")
	cmd := newCmd(v)
	var s settings
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		var err error
		s, err = read(cmd, v)
		return err
	}
	root.AddCommand(cmd)
	root.SetArgs(args)
	err := root.Execute()
	return s, err
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// luaop dev's own defaults (no /healthz, no /metrics, webhooks on loopback, removed
// at exit) yield to LUAOP_* variables and the config file, and an invalid one is
// blamed on where it was written, not on a flag the user never typed.
func TestDevDefaultsYieldToEnvironmentAndFile(t *testing.T) {
	t.Run("defaults", func(t *testing.T) {
		s, err := execSettings(t, newDevCommand, loadSettings, "dev", "scripts")
		if err != nil {
			t.Fatal(err)
		}
		if s.HealthAddress != "" || s.MetricsAddress != "" || s.WebhookAddress != "127.0.0.1:0" || !s.WebhookCleanup || s.ScriptsWebhook {
			t.Errorf("dev defaults: health %q metrics %q webhook %q cleanup %v scripts-webhook %v", s.HealthAddress, s.MetricsAddress, s.WebhookAddress, s.WebhookCleanup, s.ScriptsWebhook)
		}
	})
	t.Run("environment and file", func(t *testing.T) {
		config := writeFile(t, "luaop.yaml", "metrics-address: \":9191\"\nwebhook-cleanup: false\n")
		t.Setenv("LUAOP_HEALTH_ADDRESS", ":8081")
		t.Setenv("LUAOP_WEBHOOK_ADDRESS", ":9443")
		s, err := execSettings(t, newDevCommand, loadSettings, "dev", "--config", config, "scripts")
		if err != nil {
			t.Fatal(err)
		}
		if s.HealthAddress != ":8081" || s.MetricsAddress != ":9191" || s.WebhookAddress != ":9443" || s.WebhookCleanup {
			t.Errorf("dev ignored the environment or the file: health %q (want :8081) metrics %q (want :9191) webhook %q (want :9443) cleanup %v (want false)",
				s.HealthAddress, s.MetricsAddress, s.WebhookAddress, s.WebhookCleanup)
		}
	})
	t.Run("an invalid value is blamed on its source", func(t *testing.T) {
		t.Setenv("LUAOP_METRICS_ADDRESS", "9090")
		_, err := execSettings(t, newDevCommand, loadSettings, "dev", "scripts")
		if err == nil || !strings.Contains(err.Error(), `LUAOP_METRICS_ADDRESS="9090"`) || strings.Contains(err.Error(), "--metrics-address") {
			t.Errorf("error %v; want one naming LUAOP_METRICS_ADDRESS, not --metrics-address", err)
		}
	})
}

// luaop release reads the operator's config file (and LUAOP_* variables): the keys of
// luaop run it does not use are ignored, a misspelled key is still refused.
func TestReleaseReadsTheOperatorsConfig(t *testing.T) {
	config := writeFile(t, "luaop.yaml", "workers: 4\nlog-level: debug\nprefix: ops.example.com\nnamespaces: [team-a]\n")
	for _, via := range []string{"--config", "LUAOP_CONFIG"} {
		t.Run(via, func(t *testing.T) {
			args := []string{"release", "scripts"}
			if via == "--config" {
				args = append(args, "--config", config)
			} else {
				t.Setenv("LUAOP_CONFIG", config)
			}
			t.Setenv("LUAOP_SHARDS", "2")
			s, err := execSettings(t, newReleaseCommand, loadSubsetSettings, args...)
			if err != nil {
				t.Fatal(err)
			}
			if s.Prefix != "ops.example.com" || strings.Join(s.Namespaces, ",") != "team-a" {
				t.Errorf("release did not read the file: prefix %q namespaces %q", s.Prefix, s.Namespaces)
			}
			for _, w := range s.Warnings {
				t.Errorf("warning about a setting of luaop run: %s", w)
			}
		})
	}
	t.Run("a misspelled key", func(t *testing.T) {
		typo := writeFile(t, "luaop.yaml", "workers: 4\nprefx: ops.example.com\n")
		_, err := execSettings(t, newReleaseCommand, loadSubsetSettings, "release", "--config", typo, "scripts")
		if err == nil || !strings.Contains(err.Error(), `unknown key "prefx": did you mean "prefix"?`) {
			t.Errorf("error %v; want the misspelled key refused with a suggestion", err)
		}
	})
}

// Peering's and the cluster guard's settings: dev's priority is kopf's 666, run's
// 0; the allowed contexts come from flags (repeatable) or the config file.
func TestPeeringAndGuardSettings(t *testing.T) {
	dev, err := execSettings(t, newDevCommand, loadSettings, "dev", "scripts")
	if err != nil {
		t.Fatal(err)
	}
	run, err := execSettings(t, newRunCommand, loadSettings, "run", "scripts")
	if err != nil {
		t.Fatal(err)
	}
	if dev.Priority != 666 || run.Priority != 0 || dev.Standalone || dev.PeeringLeaseDuration != 15*time.Second {
		t.Errorf("defaults: dev priority %d, run priority %d, standalone %v, lease %s", dev.Priority, run.Priority, dev.Standalone, dev.PeeringLeaseDuration)
	}
	flags, err := execSettings(t, newDevCommand, loadSettings, "dev", "--allow-context", "staging", "--allow-context", "qa,perf", "--priority", "-5", "--standalone", "scripts")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(flags.AllowContexts, []string{"staging", "qa", "perf"}) || flags.Priority != -5 || !flags.Standalone {
		t.Errorf("flags: allow %v, priority %d, standalone %v", flags.AllowContexts, flags.Priority, flags.Standalone)
	}
	config := writeFile(t, "luaop.yaml", "allow-context: [staging, shared-dev]\npeering-namespace: ops\npeering-lease-duration: 4s\n")
	file, err := execSettings(t, newDevCommand, loadSettings, "dev", "--config", config, "scripts")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(file.AllowContexts, []string{"staging", "shared-dev"}) || file.PeeringNamespace != "ops" || file.PeeringLeaseDuration != 4*time.Second {
		t.Errorf("config file: allow %v, peering namespace %q, lease %s", file.AllowContexts, file.PeeringNamespace, file.PeeringLeaseDuration)
	}
	if _, err := execSettings(t, newDevCommand, loadSettings, "dev", "--peering-lease-duration", "1500ms", "scripts"); err == nil || !strings.Contains(err.Error(), "whole number of seconds") {
		t.Errorf("--peering-lease-duration=1500ms: %v", err)
	}
}
