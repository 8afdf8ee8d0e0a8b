package main

import (
	"testing"

	"github.com/spf13/viper"
)

// Issue 12.16: --log-events-level says which ctx.logger messages become Events;
// issue 45: none by default (kopf's since 1.41), anything else is refused.
func TestLogEventsLevelSetting(t *testing.T) {
	for _, tt := range []struct {
		args    []string
		want    string
		wantErr bool
	}{
		{nil, "none", false},
		{[]string{"--log-events-level", "info"}, "info", false},
		{[]string{"--log-events-level", "warning"}, "warning", false},
		{[]string{"--log-events-level", "none"}, "none", false},
		{[]string{"--log-events-level", "loud"}, "", true},
	} {
		v := viper.New()
		cmd := newRunCommand(v)
		if err := cmd.ParseFlags(tt.args); err != nil {
			t.Fatal(err)
		}
		s, err := loadSettings(cmd, v)
		if (err != nil) != tt.wantErr {
			t.Fatalf("%v: err = %v", tt.args, err)
		}
		if err == nil && (s.LogEvents != tt.want || luabindOptions(s, nil).LogEvents != tt.want) {
			t.Errorf("%v: LogEvents = %q, want %q", tt.args, s.LogEvents, tt.want)
		}
	}
}
