package deploy_test

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/yaml12"
)

// Issue 50: the CI recipes of deploy/ci (a GitHub Actions workflow, pre-commit hooks)
// run, as written, on the example scripts: their luaop commands pass and write the
// SARIF and JUnit reports the workflow uploads; and on a broken script the check
// fails with the finding in its SARIF report.
func TestCIRecipesRunOnTheExamples(t *testing.T) {
	deployDir, examplesDir, repoRoot := paths(t)
	bin := t.TempDir()
	build := exec.CommandContext(cmdContext(t), "go", "build", "-o", filepath.Join(bin, "luaop"), "./cmd/luaop")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building luaop: %v\n%s", err, out)
	}
	workflow := workflowCommands(t, filepath.Join(deployDir, "ci", "github-actions.yaml"))
	if len(workflow) != 2 {
		t.Fatalf("the workflow's luaop steps: %q, want check and test", workflow)
	}
	work := t.TempDir()
	for _, command := range workflow {
		if out, code := runRecipe(t, bin, work, examplesDir, command); code != 0 {
			t.Errorf("the workflow's %q exits %d on the examples:\n%s", command, code, out)
		}
	}
	sarif := readSARIF(t, filepath.Join(work, "luaop-check.sarif"))
	if len(sarif.Runs) != 1 || len(sarif.Runs[0].Results) != 0 {
		t.Errorf("luaop check's SARIF report of the examples: %+v, want one run without results", sarif)
	}
	var junit struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
	}
	data, err := os.ReadFile(filepath.Join(work, "luaop-test.xml"))
	if err != nil || xml.Unmarshal(data, &junit) != nil || junit.Tests == 0 || junit.Failures != 0 {
		t.Errorf("luaop test's JUnit report of the examples (%v): %d tests, %d failures:\n%.500s", err, junit.Tests, junit.Failures, data)
	}

	for _, command := range preCommitCommands(t, filepath.Join(deployDir, "ci", "pre-commit-config.yaml")) {
		command = strings.Replace(command, " scripts", ` "$SCRIPTS"`, 1)
		if out, code := runRecipe(t, bin, work, examplesDir, command); code != 0 {
			t.Errorf("the pre-commit hook %q exits %d on the examples:\n%s", command, code, out)
		}
	}

	// A script with Lua 5.2 syntax: the check step fails (status 3) and its report
	// holds the finding, which the workflow still uploads.
	broken := t.TempDir()
	if err := os.CopyFS(broken, os.DirFS(examplesDir)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "broken.lua"), []byte("local half = 7 // 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := runRecipe(t, bin, work, broken, workflow[0]); code != 3 {
		t.Errorf("the check step on a broken script exits %d, want 3:\n%s", code, out)
	}
	if sarif := readSARIF(t, filepath.Join(work, "luaop-check.sarif")); len(sarif.Runs) != 1 || len(sarif.Runs[0].Results) == 0 {
		t.Errorf("the SARIF report of a broken script has no finding: %+v", sarif)
	}
}

// workflowCommands are the run lines of the workflow's steps that call luaop.
func workflowCommands(t *testing.T, file string) []string {
	t.Helper()
	var workflow struct {
		Jobs map[string]struct {
			Steps []struct {
				Run string `json:"run"`
			} `json:"steps"`
		} `json:"jobs"`
	}
	decodeYAML(t, file, &workflow)
	var out []string
	for _, job := range workflow.Jobs {
		for _, step := range job.Steps {
			if strings.HasPrefix(step.Run, "luaop ") {
				out = append(out, strings.TrimSpace(step.Run))
			}
		}
	}
	return out
}

// preCommitCommands are the hooks' entries with their arguments.
func preCommitCommands(t *testing.T, file string) []string {
	t.Helper()
	var config struct {
		Repos []struct {
			Hooks []struct {
				Entry string   `json:"entry"`
				Args  []string `json:"args"`
			} `json:"hooks"`
		} `json:"repos"`
	}
	decodeYAML(t, file, &config)
	var out []string
	for _, repo := range config.Repos {
		for _, hook := range repo.Hooks {
			out = append(out, strings.Join(append([]string{hook.Entry}, hook.Args...), " "))
		}
	}
	if len(out) != 2 {
		t.Fatalf("pre-commit hooks: %q, want check and test", out)
	}
	return out
}

func decodeYAML(t *testing.T, file string, into any) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	v, err := yaml12.Unmarshal(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	raw, _ := json.Marshal(v)
	if err := json.Unmarshal(raw, into); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}

// runRecipe runs a recipe's command line with bash in dir, luaop from bin on the PATH
// and SCRIPTS set, as the workflow's env does.
func runRecipe(t *testing.T, bin, dir, scripts, command string) (string, int) {
	t.Helper()
	cmd := exec.CommandContext(cmdContext(t), "bash", "-euo", "pipefail", "-c", command)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"), "SCRIPTS="+scripts)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return string(out), exit.ExitCode()
	}
	if err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	return string(out), 0
}

type sarifReport struct {
	Version string `json:"version"`
	Runs    []struct {
		Results []json.RawMessage `json:"results"`
	} `json:"runs"`
}

func readSARIF(t *testing.T, file string) sarifReport {
	t.Helper()
	var report sarifReport
	data, err := os.ReadFile(file)
	if err != nil || json.Unmarshal(data, &report) != nil || report.Version != "2.1.0" {
		t.Fatalf("%s is not a SARIF 2.1.0 report (%v):\n%.500s", file, err, data)
	}
	return report
}
