package main

import (
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/luaop/luaop/scriptcheck"
)

// CI reads luaop check's and luaop test's reports: SARIF and JSON of the problems,
// JUnit XML and JSON of the cases, on standard output, with the exit statuses of the
// text output.
func TestReportFormats(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.lua", "local luaop = require('luaop')\nluaop.on.create('example.com/v1/widgets', function(ctx) return 1 end, {id = 'one'})\n")
	write("tests/t.yaml", "cases:\n- name: passes\n  handler: one\n  object: {apiVersion: example.com/v1, kind: Widget, metadata: {name: c}}\n  expect: {result: 1}\n- name: fails\n  handler: one\n  object: {apiVersion: example.com/v1, kind: Widget, metadata: {name: c}}\n  expect: {result: 2}\n")

	out, _, err := runCLI(t, "test", "--format", "junit", dir)
	if exitCode(err) != exitTestsFailed {
		t.Errorf("luaop test --format junit with a failing case: exit %d", exitCode(err))
	}
	var suites junitSuites
	if err := xml.Unmarshal([]byte(out), &suites); err != nil {
		t.Fatalf("not JUnit XML: %v\n%s", err, out)
	}
	if suites.Tests != 2 || suites.Failures != 1 || len(suites.Suites) != 1 || suites.Suites[0].Name != "t.yaml" {
		t.Fatalf("JUnit: %+v", suites)
	}
	cases := suites.Suites[0].Cases
	if cases[0].Name != "passes" || cases[0].Failure != nil || cases[1].Failure == nil || !strings.Contains(cases[1].Failure.Text, "result") || cases[1].Line != 6 {
		t.Errorf("JUnit cases: %+v", cases)
	}

	out, _, _ = runCLI(t, "test", "--format", "json", dir)
	var tj testJSON
	if err := json.Unmarshal([]byte(out), &tj); err != nil || tj.Passed != 1 || tj.Failed != 1 || len(tj.Cases) != 2 || tj.Cases[1].Passed {
		t.Errorf("test JSON: %v %+v", err, tj)
	}

	write("b.lua", "local n = 7 // 2\n")
	out, _, err = runCLI(t, "check", "--format", "sarif", dir)
	if exitCode(err) != exitProblems {
		t.Errorf("luaop check --format sarif with a problem: exit %d", exitCode(err))
	}
	var sarif sarifLog
	if err := json.Unmarshal([]byte(out), &sarif); err != nil || sarif.Version != "2.1.0" || len(sarif.Runs) != 1 || len(sarif.Runs[0].Results) == 0 {
		t.Fatalf("SARIF: %v\n%s", err, out)
	}
	r := sarif.Runs[0].Results[0]
	loc := r.Locations[0].PhysicalLocation
	if r.RuleID != scriptcheck.RuleLoad || r.Level != "error" || !strings.HasSuffix(loc.ArtifactLocation.URI, "/b.lua") || loc.Region == nil || loc.Region.StartLine != 1 || !strings.Contains(r.Message.Text, "//") {
		t.Errorf("SARIF result: %+v", r)
	}
	// One rule per check, with the level its message deserves: an option the
	// operator would ignore is a warning, not an error.
	write("c.lua", "local luaop = require('luaop')\nluaop.on.event('v1/configmaps', function(ctx) end, {id = 'e', retries = 3})\n")
	out, _, _ = runCLI(t, "check", "--format", "sarif", dir)
	sarif = sarifLog{}
	if err := json.Unmarshal([]byte(out), &sarif); err != nil || len(sarif.Runs) != 1 {
		t.Fatalf("SARIF: %v\n%s", err, out)
	}
	levels := map[string]string{}
	for _, r := range sarif.Runs[0].Results {
		levels[r.RuleID] = r.Level
	}
	if levels[scriptcheck.RuleLoad] != "error" || levels[scriptcheck.RuleIgnoredOption] != "warning" {
		t.Errorf("SARIF rules and levels %v, want load: error and ignored-option: warning\n%s", levels, out)
	}
	if n := len(sarif.Runs[0].Tool.Driver.Rules); n != len(scriptcheck.Rules) {
		t.Errorf("the driver lists %d rules, want every rule of luaop check (%d)", n, len(scriptcheck.Rules))
	}
	if err := os.Remove(filepath.Join(dir, "c.lua")); err != nil {
		t.Fatal(err)
	}
	out, _, _ = runCLI(t, "check", "--format", "json", dir)
	var cj checkJSON
	if err := json.Unmarshal([]byte(out), &cj); err != nil || cj.OK || len(cj.Problems) == 0 || cj.Problems[0].File != "b.lua" || cj.Problems[0].Line != 1 {
		t.Errorf("check JSON: %v %+v", err, cj)
	}
	if _, _, err := runCLI(t, "check", "--format", "xml", dir); exitCode(err) != exitUsage {
		t.Errorf("--format xml: exit %d, want a usage error", exitCode(err))
	}
}
