package luaop_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/testcluster"
)

// makeInCode finds `make TARGET` in the code of a markdown file: inline code spans
// and the lines of fenced blocks (prose such as "make the scripts" is not code).
var (
	inlineCode = regexp.MustCompile("`([^`\n]+)`")
	makeTarget = regexp.MustCompile(`(?:^|[\s;&|(])make ([a-z][a-z0-9-]*)`)
)

// docTargets are the Makefile targets the markdown files of the repository name in
// their code, each with a file that names it.
func docTargets(t *testing.T, repo string) map[string]string {
	t.Helper()
	out, err := exec.Command("git", "-C", repo, "ls-files", "*.md").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (a clone of the repository is needed)", err)
	}
	targets := map[string]string{}
	for _, md := range strings.Fields(string(out)) {
		text, err := os.ReadFile(filepath.Join(repo, md))
		if err != nil {
			t.Fatal(err)
		}
		var code []string
		fenced := false
		for _, line := range strings.Split(string(text), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				fenced = !fenced
				continue
			}
			if fenced {
				code = append(code, line)
				continue
			}
			for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
				code = append(code, m[1])
			}
		}
		for _, c := range code {
			for _, m := range makeTarget.FindAllStringSubmatch(c, -1) {
				if _, ok := targets[m[1]]; !ok {
					targets[m[1]] = md
				}
			}
		}
	}
	return targets
}

// Every `make TARGET` the documentation shows exists and expands (make -n), and
// those that write into bin/ (make image-archive, the first command of deploy/'s
// recipes) work in a fresh clone, which has no bin/ yet.
func TestMakeTargetsOfTheDocsWorkFromACleanClone(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make on PATH")
	}
	repo, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	targets := docTargets(t, repo)
	for _, want := range []string{"image-archive", "node", "node-down", "test", "dev"} {
		if _, ok := targets[want]; !ok {
			t.Errorf("no markdown file names make %s: the scan of the docs misses code", want)
		}
	}
	clone := t.TempDir()
	if err := testcluster.CleanCopy(repo, clone); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(targets))
	for name := range targets {
		names = append(names, name)
	}
	slices.Sort(names)
	t.Logf("targets the docs name: %s", strings.Join(names, " "))
	for _, name := range names {
		cmd := exec.Command("make", "-n", name)
		cmd.Dir = clone
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("make -n %s (named in %s): %v\n%s", name, targets[name], err, out)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "image-archive")
	cmd.Dir = clone
	began := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image-archive in a fresh clone: %v\n%s", err, out)
	}
	if fi, err := os.Stat(filepath.Join(clone, "bin", "luaop-image.tar")); err != nil || fi.Size() == 0 {
		t.Errorf("make image-archive wrote no bin/luaop-image.tar: %v", err)
	}
	t.Logf("make image-archive in a fresh clone: %s", time.Since(began).Round(time.Second))
}
