package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
)

// One default per setting (issue 44): the handler deadline, the default backoff and
// the storage are the same in every command that takes them, the operator's (luaop
// test used a 10 s deadline where luaop run has 30 s), and each command's --help
// says it.
func TestOneDefaultPerSetting(t *testing.T) {
	want := map[string]string{
		"handler-timeout":  luabind.DefaultHandlerTimeout.String(),
		"default-backoff":  handling.DefaultBackoff.String(),
		"progress-storage": string(processing.StorageAuto),
		"diffbase-storage": string(processing.StorageAuto),
	}
	if luabind.DefaultHandlerTimeout.String() != "30s" || handling.DefaultBackoff.String() != "1m0s" {
		t.Fatalf("the documented defaults changed: handler timeout %s, backoff %s (README says 30s and 60s)", luabind.DefaultHandlerTimeout, handling.DefaultBackoff)
	}
	seen := map[string]int{}
	for _, name := range []string{"run", "dev", "test", "check"} {
		root := newRootCommand()
		cmd, _, err := root.Find([]string{name})
		if err != nil || cmd.Name() != name {
			t.Fatalf("luaop %s: %v", name, err)
		}
		var help bytes.Buffer
		cmd.SetOut(&help)
		if err := cmd.Help(); err != nil {
			t.Fatal(err)
		}
		for flag, def := range want {
			f := cmd.Flags().Lookup(flag)
			if f == nil {
				continue
			}
			seen[flag]++
			if f.DefValue != def {
				t.Errorf("luaop %s --%s defaults to %s, want %s (the operator's)", name, flag, f.DefValue, def)
			}
			line := ""
			for l := range strings.Lines(help.String()) {
				if strings.Contains(l, "--"+flag+" ") {
					line = l
				}
			}
			if !strings.Contains(line, "(default "+strconvQuote(f.Value.Type(), def)+")") {
				t.Errorf("luaop %s --help does not say --%s's default %s: %q", name, flag, def, line)
			}
		}
	}
	// handler-timeout: run, dev, test, check; default-backoff: run, dev, test.
	if seen["handler-timeout"] != 4 || seen["default-backoff"] != 3 || seen["progress-storage"] != 2 {
		t.Errorf("the commands taking each setting: %v", seen)
	}
}

// strconvQuote is a default as pflag's help prints it (strings quoted).
func strconvQuote(typ, def string) string {
	if typ == "string" {
		return `"` + def + `"`
	}
	return def
}
