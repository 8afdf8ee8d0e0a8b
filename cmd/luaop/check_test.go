package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/testcluster"
)

// runCLI runs the luaop command line and returns its output and error.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err = root.ExecuteContext(t.Context())
	return out.String(), errOut.String(), err
}

func TestCheckExamples(t *testing.T) {
	out, _, err := runCLI(t, "check", filepath.Join(testcluster.RepoRoot(), "scripts", "examples"))
	if err != nil || !strings.HasPrefix(out, "ok: 8 file(s)") {
		t.Fatalf("luaop check scripts/examples: %v\n%s", err, out)
	}
}

func TestCheckReportsProblems(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.lua", "local luaop = require('luaop')\nluaop.on.create('v1/configmaps', function(ctx)\n  print(os.getenv('HOME'))\nend, {interval = 3})\n")
	write("b.lua", "local n = 7 // 2\n")
	out, stderr, err := runCLI(t, "check", dir)
	if err == nil {
		t.Fatalf("want exit status 1; output:\n%s", out)
	}
	want := "a.lua:3: os.getenv is not available in luaop's sandbox (its os has clock, date, time)\n" +
		"a.lua:4: luaop.on.create: option interval does not apply here (only to timers); it would be ignored\n" +
		"b.lua:1: '//' (floor division, Lua 5.3) is not Lua 5.1: write math.floor(a / b)\n"
	if out != want {
		t.Errorf("output:\n%s\nwant:\n%s", out, want)
	}
	if !strings.Contains(stderr, "3 problem(s)") {
		t.Errorf("stderr: %q", stderr)
	}
}

func TestStubsWritesLuacheckrc(t *testing.T) {
	rc := filepath.Join(t.TempDir(), ".luacheckrc")
	if _, _, err := runCLI(t, "stubs", "-o", filepath.Join(t.TempDir(), "luaop.lua"), "--luacheckrc", rc); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(rc)
	if err != nil || !strings.Contains(string(data), `std = "luaop"`) {
		t.Fatalf(".luacheckrc: %v\n%s", err, data)
	}
}
