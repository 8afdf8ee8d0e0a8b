package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/luaop/luaop/scriptcheck"
	"github.com/luaop/luaop/scripttest"
)

// Machine-readable reports of luaop check and luaop test, for CI: JSON for both,
// SARIF 2.1.0 (code scanning) for check, JUnit XML for test.

// checkJSON is luaop check --format json.
type checkJSON struct {
	Dir      string        `json:"dir"`
	Files    int           `json:"files"`
	Handlers []string      `json:"handlers"`
	Problems []problemJSON `json:"problems"`
	OK       bool          `json:"ok"`
}

type problemJSON struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
	Rule    string `json:"rule"`
	Level   string `json:"level"`
}

func writeCheckJSON(w io.Writer, dir string, rep scriptcheck.CheckReport) error {
	doc := checkJSON{Dir: dir, Files: rep.Files, Handlers: rep.Handlers, Problems: []problemJSON{}, OK: len(rep.Problems) == 0}
	if doc.Handlers == nil {
		doc.Handlers = []string{}
	}
	for _, p := range rep.Problems {
		doc.Problems = append(doc.Problems, problemJSON{File: p.File, Line: p.Line, Message: p.Message, Rule: scriptcheck.RuleOf(p.Rule).ID, Level: scriptcheck.RuleOf(p.Rule).Level})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// SARIF 2.1.0 (OASIS), the parts luaop check fills in.
type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool    sarifTool     `json:"tool"`
	Results []sarifResult `json:"results"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name           string      `json:"name"`
	Version        string      `json:"version,omitempty"`
	InformationURI string      `json:"informationUri"`
	Rules          []sarifRule `json:"rules"`
}

type sarifRule struct {
	ID                   string              `json:"id"`
	ShortDescription     sarifMessage        `json:"shortDescription"`
	DefaultConfiguration *sarifConfiguration `json:"defaultConfiguration,omitempty"`
}

type sarifConfiguration struct {
	Level string `json:"level"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	Level     string          `json:"level"`
	Message   sarifMessage    `json:"message"`
	Locations []sarifLocation `json:"locations"`
}

type sarifMessage struct {
	Text string `json:"text"`
}

type sarifLocation struct {
	PhysicalLocation sarifPhysical `json:"physicalLocation"`
}

type sarifPhysical struct {
	ArtifactLocation sarifArtifact `json:"artifactLocation"`
	Region           *sarifRegion  `json:"region,omitempty"`
}

type sarifArtifact struct {
	URI string `json:"uri"`
}

type sarifRegion struct {
	StartLine int `json:"startLine"`
}

func writeCheckSARIF(w io.Writer, dir string, rep scriptcheck.CheckReport) error {
	rules := make([]sarifRule, 0, len(scriptcheck.Rules))
	for _, r := range scriptcheck.Rules {
		rules = append(rules, sarifRule{ID: r.ID, ShortDescription: sarifMessage{Text: r.Description},
			DefaultConfiguration: &sarifConfiguration{Level: r.Level}})
	}
	run := sarifRun{
		Tool:    sarifTool{Driver: sarifDriver{Name: "luaop check", Version: luaopVersion(), InformationURI: "https://github.com/luaop/luaop", Rules: rules}},
		Results: []sarifResult{},
	}
	for _, p := range rep.Problems {
		file := p.File
		if file == "." {
			file = ""
		}
		loc := sarifLocation{PhysicalLocation: sarifPhysical{ArtifactLocation: sarifArtifact{URI: filepath.ToSlash(filepath.Join(dir, file))}}}
		if p.Line > 0 {
			loc.PhysicalLocation.Region = &sarifRegion{StartLine: p.Line}
		}
		rule := scriptcheck.RuleOf(p.Rule)
		run.Results = append(run.Results, sarifResult{RuleID: rule.ID, Level: rule.Level, Message: sarifMessage{Text: p.Message}, Locations: []sarifLocation{loc}})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(sarifLog{Schema: "https://json.schemastore.org/sarif-2.1.0.json", Version: "2.1.0", Runs: []sarifRun{run}})
}

// testJSON is luaop test --format json.
type testJSON struct {
	Passed      int        `json:"passed"`
	Failed      int        `json:"failed"`
	TookSeconds float64    `json:"took_seconds"`
	Cases       []caseJSON `json:"cases"`
}

type caseJSON struct {
	File        string   `json:"file"`
	Name        string   `json:"name"`
	Line        int      `json:"line"`
	Passed      bool     `json:"passed"`
	TookSeconds float64  `json:"took_seconds"`
	Failures    []string `json:"failures,omitempty"`
}

func writeTestJSON(w io.Writer, sum scripttest.Summary) error {
	doc := testJSON{Passed: sum.Passed, Failed: sum.Failed, TookSeconds: sum.Took.Seconds(), Cases: []caseJSON{}}
	for _, c := range sum.Cases {
		doc.Cases = append(doc.Cases, caseJSON{File: c.File, Name: c.Name, Line: c.Line, Passed: len(c.Failures) == 0,
			TookSeconds: c.Took.Seconds(), Failures: c.Failures})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// JUnit XML as CI servers read it (the Ant/Jenkins schema): one testsuite per test
// file, one testcase per case, a failure element per failing case.
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Name     string       `xml:"name,attr"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name      string      `xml:"name,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Errors    int         `xml:"errors,attr"`
	Skipped   int         `xml:"skipped,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr"`
	Cases     []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	File      string        `xml:"file,attr,omitempty"`
	Line      int           `xml:"line,attr,omitempty"`
	Failure   *junitFailure `xml:"failure,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.3f", d.Seconds()) }

func writeTestJUnit(w io.Writer, sum scripttest.Summary, started time.Time) error {
	doc := junitSuites{Name: "luaop test", Tests: len(sum.Cases), Failures: sum.Failed, Time: seconds(sum.Took)}
	index := map[string]int{}
	took := map[int]time.Duration{}
	for _, c := range sum.Cases {
		i, ok := index[c.File]
		if !ok {
			i = len(doc.Suites)
			index[c.File] = i
			doc.Suites = append(doc.Suites, junitSuite{Name: filepath.Base(c.File), Timestamp: started.UTC().Format("2006-01-02T15:04:05")})
		}
		s := &doc.Suites[i]
		jc := junitCase{Name: c.Name, Classname: strings.TrimSuffix(filepath.Base(c.File), filepath.Ext(c.File)), Time: seconds(c.Took), File: c.File, Line: c.Line}
		if len(c.Failures) > 0 {
			first, _, _ := strings.Cut(c.Failures[0], "\n")
			jc.Failure = &junitFailure{Message: first, Type: "failure", Text: strings.Join(c.Failures, "\n")}
			s.Failures++
		}
		s.Tests++
		s.Cases = append(s.Cases, jc)
		took[i] += c.Took
	}
	for i := range doc.Suites {
		doc.Suites[i].Time = seconds(took[i])
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
