package main

import (
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
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(t *testing.T, s settings)
	}{
		{"defaults", nil, nil, func(t *testing.T, s settings) {
			if s.Workers != 16 || s.Prefix != "luaop.dev" || s.LogFormat != "json" || s.HandlerTimeout != 30*time.Second || s.ProgressStorage != "auto" || s.DiffBaseStorage != "auto" {
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			v := viper.New()
			cmd := newRunCommand(v)
			cmd.Flags().String("config", "", "")
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatal(err)
			}
			s, err := loadSettings(cmd, v)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, s)
		})
	}
}

func TestSettingsRejectBadValues(t *testing.T) {
	for _, args := range [][]string{{"--log-format", "xml"}, {"--progress-storage", "etcd"}, {"--lifecycle", "random"}} {
		v := viper.New()
		cmd := newRunCommand(v)
		cmd.Flags().String("config", "", "")
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		if _, err := loadSettings(cmd, v); err == nil {
			t.Errorf("%v: want an error naming the accepted values", args)
		}
	}
}
