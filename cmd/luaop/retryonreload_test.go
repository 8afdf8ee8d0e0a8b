package main

import (
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/viper"
)

// Issue 45: luaop dev retries at once a handler whose code a reload changed;
// luaop run keeps its backoff unless --retry-on-reload asks.
func TestRetryOnReloadSetting(t *testing.T) {
	for _, tt := range []struct {
		name string
		cmd  func(*viper.Viper) *cobra.Command
		args []string
		env  string
		want bool
	}{
		{"run", newRunCommand, nil, "", false},
		{"run --retry-on-reload", newRunCommand, []string{"--retry-on-reload"}, "", true},
		{"dev", newDevCommand, nil, "", true},
		{"dev, LUAOP_RETRY_ON_RELOAD=false", newDevCommand, nil, "false", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.env != "" {
				t.Setenv("LUAOP_RETRY_ON_RELOAD", tt.env)
			}
			v := viper.New()
			cmd := tt.cmd(v)
			if err := cmd.ParseFlags(tt.args); err != nil {
				t.Fatal(err)
			}
			s, err := loadSettings(cmd, v)
			if err != nil {
				t.Fatal(err)
			}
			if s.RetryOnReload != tt.want {
				t.Errorf("RetryOnReload = %v, want %v", s.RetryOnReload, tt.want)
			}
		})
	}
}
