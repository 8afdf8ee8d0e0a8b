package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// `luaop version` lists the versions someone reporting a problem is asked for.
func TestVersionCommandListsComponents(t *testing.T) {
	var out bytes.Buffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetArgs([]string{"version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^luaop +\S+`),
		regexp.MustCompile(`(?m)^go +` + regexp.QuoteMeta(runtime.Version()) + ` `),
		// third_party/gopher-lua replaces it (issue 34).
		regexp.MustCompile(`(?m)^gopher-lua +v\d+\.\d+\.\d+ \(patched: third_party/gopher-lua\) \(Lua 5\.1\)$`),
		regexp.MustCompile(`(?m)^client-go +v0\.\d+\.\d+$`),
	} {
		if !want.MatchString(out.String()) {
			t.Errorf("luaop version printed\n%s\nwant a line matching %s", out.String(), want)
		}
	}
}

// --version prints the version stamped with -ldflags "-X main.version=..." (what the
// Makefile and the Dockerfile do with git describe).
func TestVersionFlagIsStamped(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "luaop")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7-test", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("luaop %v: %v\n%s", args, err, out)
		}
		if !strings.HasPrefix(string(out), "luaop ") || !strings.Contains(string(out), "v9.8.7-test") {
			t.Errorf("luaop %v printed %q; want the stamped version v9.8.7-test", args, out)
		}
	}
	// No text/template executes in the binary: its evaluator calls reflect's
	// MethodByName, and then the linker keeps every exported method of every type it
	// sees (cobra's SetVersionTemplate did that: all of client-go's typed clients were
	// linked, 29 MB more binary and about 12 MiB more RSS at start).
	nm, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	if strings.Contains(string(nm), "text/template.(*state).evalField") {
		t.Errorf("the binary links text/template's evaluator (a template is executed somewhere: cobra's Set*Template?); dead-code elimination of methods is off")
	}
	// -v is --verbose in the subcommands, not the version.
	out, _ := exec.Command(bin, "run", "--help").CombinedOutput()
	if !strings.Contains(string(out), "-v, --verbose") || !strings.Contains(string(out), "-q, --quiet") {
		t.Errorf("luaop run --help lacks -v/--verbose or -q/--quiet:\n%s", out)
	}
}

// `luaop stubs -o DIR/FILE` creates the missing folders, as does --luacheckrc.
func TestStubsCreatesFolders(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "config", "luaop", "luaop.lua")
	rc := filepath.Join(dir, "handlers", "deep", ".luacheckrc")
	root := newRootCommand()
	root.SetArgs([]string{"stubs", "-o", out, "--luacheckrc", rc})
	if err := root.Execute(); err != nil {
		t.Fatalf("luaop stubs -o %s: %v", out, err)
	}
	for _, p := range []string{out, rc} {
		if b, err := os.ReadFile(p); err != nil || len(b) == 0 {
			t.Errorf("%s: %v (%d bytes)", p, err, len(b))
		}
	}
}

// make build and the image stamp the version as the test above does.
func TestBuildsStampTheVersion(t *testing.T) {
	for _, f := range []string{"Makefile", "Dockerfile"} {
		b, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "-X main.version=$") {
			t.Errorf("%s does not stamp the version (-ldflags \"-X main.version=...\")", f)
		}
	}
	mk, _ := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if !strings.Contains(string(mk), "git describe --tags --always --dirty") {
		t.Errorf("the Makefile's version is not git describe's")
	}
}
