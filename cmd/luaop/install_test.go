package main

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

// readRepoFile reads a file of the repository's root.
func readRepoFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// newestRelease is the version of the newest release heading of CHANGELOG.md
// ("## [0.1.0] - 2026-12-01" -> "v0.1.0").
func newestRelease(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`).FindStringSubmatch(readRepoFile(t, "CHANGELOG.md"))
	if m == nil {
		t.Fatal("CHANGELOG.md has no release heading ## [X.Y.Z] - YYYY-MM-DD")
	}
	return "v" + m[1]
}

// What a platform team looks for before adopting luaop: the license, the changes, how
// to report a vulnerability, and how to install a version.
func TestInstallAndReleaseFiles(t *testing.T) {
	if l := readRepoFile(t, "LICENSE"); !strings.Contains(l, "Apache License") || !strings.Contains(l, "Version 2.0, January 2004") {
		t.Error("LICENSE is not the Apache License 2.0")
	}
	if s := readRepoFile(t, "SECURITY.md"); !strings.Contains(s, "Reporting a vulnerability") {
		t.Error("SECURITY.md does not say how to report a vulnerability")
	}
	version := newestRelease(t)
	readme := readRepoFile(t, "README.md")
	// No release is tagged yet (issue 50): the first lines say what works from a
	// checkout, and how a tagged release will install.
	first := strings.Join(strings.SplitN(readme, "\n", 17)[:16], "\n")
	for _, want := range []string{"go install ./cmd/luaop", "make install", "make image-archive", "go install github.com/luaop/luaop/cmd/luaop@"} {
		if !strings.Contains(first, want) {
			t.Errorf("README's first lines do not say %q:\n%s", want, first)
		}
	}
	// go install pkg@version refuses a module whose go.mod has replace or exclude
	// directives; the main package must be where the line says.
	gomod := readRepoFile(t, "go.mod")
	if m := regexp.MustCompile(`(?m)^\s*(replace|exclude)\b`).FindString(gomod); m != "" {
		t.Errorf("go.mod has a %s directive: `go install github.com/luaop/luaop/cmd/luaop@%s` would refuse the module", strings.TrimSpace(m), version)
	}
	if !strings.HasPrefix(gomod, "module github.com/luaop/luaop\n") {
		t.Error("go.mod's module path is not github.com/luaop/luaop")
	}
	mk := readRepoFile(t, "Makefile")
	for _, want := range []string{"release:", "linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64", "sha256sum", "dist/", "CGO_ENABLED=0"} {
		if !strings.Contains(mk, want) {
			t.Errorf("the Makefile's release target lacks %q", want)
		}
	}
	// The template users copy names the release: its remote base and its image.
	ks := readRepoFile(t, "deploy/my-scripts/kustomization.yaml")
	for _, want := range []string{"deploy/base?ref=" + version, "newTag: " + version} {
		if !strings.Contains(ks, want) {
			t.Errorf("deploy/my-scripts/kustomization.yaml lacks %q (the newest release of CHANGELOG.md)", want)
		}
	}
}

// Without a stamp, the version is the module's (go install @version) or the VCS
// revision go build recorded, never a bare (devel) when Go knows better.
func TestBuildVersionFallsBackToVCS(t *testing.T) {
	for _, tt := range []struct {
		name string
		info debug.BuildInfo
		want string
	}{
		{"go install @version", debug.BuildInfo{Main: debug.Module{Version: "v0.1.0"}}, "v0.1.0"},
		{"a checkout", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "dd26b51c0ffee0123456789abcdef0123456789a"}, {Key: "vcs.modified", Value: "false"}}}, "devel-dd26b51c0ffe"},
		{"a dirty checkout", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "dd26b51c0ffee0123456789abcdef0123456789a"}, {Key: "vcs.modified", Value: "true"}}}, "devel-dd26b51c0ffe-dirty"},
		{"no VCS information (-buildvcs=false)", debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "(devel)"},
	} {
		if got := buildVersion(&tt.info); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}
