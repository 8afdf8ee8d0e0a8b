package scripttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"sigs.k8s.io/yaml"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/handling"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/scriptsource"
	"github.com/luaop/luaop/scripttest/fakeapi"
	"github.com/luaop/luaop/state"
	"github.com/luaop/luaop/yaml12"
)

// File is one YAML file of test cases.
type File struct {
	// CRDs are CustomResourceDefinition files every case of the file serves (as a
	// case's own crds:, which it adds to): the scope, schema and subresources of the
	// file's custom resources, written once.
	CRDs  []string `json:"crds,omitempty"`
	Cases []Case   `json:"cases"`
}

// Case is one test case.
type Case struct {
	Name string `json:"name"`
	// Handler is the id of the handler to run; Cause (create, update, delete,
	// resume) runs every change handler of the object's resource serving it whose
	// filters match, in registration order. One of them is required.
	Handler string `json:"handler,omitempty"`
	Cause   string `json:"cause,omitempty"`
	// Object is the object, inline; ObjectFile a YAML file holding it (a relative
	// path is relative to the test file, an absolute one is used as it is); a
	// hook's case needs none. Old is the previous version (updates, field handlers;
	// a resume without it takes the object as the state last handled).
	Object     map[string]any `json:"object,omitempty"`
	ObjectFile string         `json:"objectFile,omitempty"`
	Old        map[string]any `json:"old,omitempty"`
	// Resource is the watched resource ("group/version/plural") when it cannot be
	// told from the object's apiVersion and the handlers (cause mode).
	Resource string `json:"resource,omitempty"`
	// EventType is the watch event type for on.event handlers (default MODIFIED).
	EventType string `json:"eventType,omitempty"`
	// Related are the changes of related objects a luaop.on.related handler is
	// given (cause: related, or handler: ID of such a handler).
	Related []RelatedCase `json:"related,omitempty"`
	// Objects are the objects the fake API holds (luaop.kube get/list/...).
	Objects []map[string]any `json:"objects,omitempty"`
	// CRDs are files of CustomResourceDefinitions (relative to the test file) whose
	// custom resources the fake API serves as the API server does: validated against
	// the schema (CEL rules included), defaulted, pruned, status only through the
	// status subresource. Other custom resources are stored as given.
	CRDs []string `json:"crds,omitempty"`
	// Fail are the calls the fake API refuses, to test a handler's error paths:
	// each {verb, resource, name, namespace, code, times, message} (fakeapi.Failure;
	// code 400 to 504 or "timeout"; times 0: every matching call).
	Fail []fakeapi.Failure `json:"fail,omitempty"`
	// Operation, DryRun and UserInfo are the admission request of a validate or
	// mutate handler (handler: ID): operation defaults to UPDATE when old is given,
	// else CREATE (on DELETE the object is the old one); userInfo to
	// {username: luaop-test}.
	Operation string         `json:"operation,omitempty"`
	DryRun    bool           `json:"dryRun,omitempty"`
	UserInfo  map[string]any `json:"userInfo,omitempty"`
	// Indexes are the operator's indexes as handlers see them: index -> key -> values.
	Indexes map[string]map[string][]any `json:"indexes,omitempty"`
	Expect  Expect                      `json:"expect"`
}

// Expect is the expected outcome; only what is given is compared. Non-empty maps are
// compared as subsets (keys not given are not compared); lists, strings and numbers
// exactly. An empty map or list given explicitly ({} or []) asserts emptiness: patch:
// {} means no patch was written, status: {} no status, events/kube/objects: [] none.
// result: null asserts that the handler returned nothing.
type Expect struct {
	Patch  map[string]any `json:"patch,omitempty"`
	Object map[string]any `json:"object,omitempty"`
	Status map[string]any `json:"status,omitempty"`
	// Result is what the handler returned (status.<id> for change handlers and
	// timers; the entries of an index function).
	Result any `json:"result,omitempty"`
	// Error is the error raised; without it, an error fails the case.
	Error *ExpectError `json:"error,omitempty"`
	// Events are the Events posted, in order (type, reason, message: subsets).
	Events []map[string]any `json:"events,omitempty"`
	// Kube are the luaop.kube calls made, in order, each a subset of {verb,
	// apiVersion, kind, namespace, name, body, error}.
	Kube []map[string]any `json:"kube,omitempty"`
	// Objects are objects the fake API must hold afterwards (subsets).
	Objects []map[string]any `json:"objects,omitempty"`
	// Skipped: the handler's filters do not match the object.
	Skipped bool `json:"skipped,omitempty"`
	// Admission handlers (validate, mutate): the verdict (allowed is required),
	// the rejection's message (a substring) and code, the warnings (exactly).
	// patch is what a mutate handler wrote into ctx.patch, object the object with
	// it applied.
	Allowed  *bool    `json:"allowed,omitempty"`
	Message  string   `json:"message,omitempty"`
	Code     int      `json:"code,omitempty"`
	Warnings []string `json:"warnings,omitempty"`

	// given holds the keys the case wrote, so that an explicit {}, [] or null can
	// be told from an expectation that is not given.
	given map[string]bool
}

// UnmarshalJSON records which expectations are given (sigs.k8s.io/yaml turns the
// YAML into JSON first) and decodes the rest strictly. objects: {} is read as
// objects: [] (no objects).
func (e *Expect) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	if r, ok := raw["objects"]; ok && strings.TrimSpace(string(r)) == "{}" {
		raw["objects"] = json.RawMessage("[]")
		data, _ = json.Marshal(raw)
	}
	type plain Expect
	var p plain
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return err
	}
	*e = Expect(p)
	e.given = map[string]bool{}
	for k := range raw {
		e.given[k] = true
	}
	return nil
}

// Given tells whether the case wrote the expectation key (patch, status, result, ...),
// even as {}, [] or null.
func (e Expect) Given(key string) bool { return e.given[key] }

// ExpectError describes an expected error.
type ExpectError struct {
	// Type: temporary (luaop.temporary_error), permanent (luaop.permanent_error)
	// or error (anything else: retried after the handler's backoff).
	Type    string   `json:"type,omitempty"`
	Message string   `json:"message,omitempty"` // a substring of the message
	Delay   *float64 `json:"delay,omitempty"`   // seconds (temporary errors)
}

// Options configure Run.
type Options struct {
	// Scripts is the scripts folder; Tests the YAML files of cases.
	Scripts string
	Tests   []string
	// Run, when set, selects the cases whose "file/name" it matches.
	Run *regexp.Regexp
	// Verbose prints passing cases too.
	Out     io.Writer
	Verbose bool
	// Prefix is the operator's annotation and status prefix (luaop run --prefix);
	// empty means DefaultPrefix.
	Prefix string
	// HandlerTimeout is the deadline of each call (luaop run --handler-timeout),
	// loading and compiling the scripts included. Default DefaultHandlerTimeout.
	HandlerTimeout time.Duration
	// DefaultBackoff is the operator's backoff after an arbitrary error (luaop run
	// --default-backoff), which the verdict on an attempt looks ahead with (a
	// handler's timeout). Default handling.DefaultBackoff.
	DefaultBackoff time.Duration
}

// DefaultHandlerTimeout is the deadline of a test's calls when none is given: the
// operator's (luaop run --handler-timeout's default), so that what passes here is
// held to the deadline it will run under.
const DefaultHandlerTimeout = luabind.DefaultHandlerTimeout

// DefaultPrefix is luaop run's default --prefix.
const DefaultPrefix = "luaop.dev"

// Summary counts the cases and holds each one's result.
type Summary struct {
	Passed, Failed int
	Cases          []CaseResult
	Took           time.Duration
}

// CaseResult is the outcome of one case.
type CaseResult struct {
	// File is the test file's path, Name the case's name (case<N> when it has none),
	// Line where the case starts in the file.
	File, Name string
	Line       int
	Took       time.Duration
	// Failures are what did not match (empty: passed), each a message that may span
	// lines (a diff).
	Failures []string
}

// FullName is "FILE/NAME" as --run matches it (FILE: the file's base name).
func (c CaseResult) FullName() string { return filepath.Base(c.File) + "/" + c.Name }

// ErrNoCaseMatches is returned when Options.Run selects no case: a --run that
// matches nothing is a mistake, not a pass.
var ErrNoCaseMatches = errors.New("no case matches")

// MalformedTestFileError is a test file that does not parse, or whose keys are not
// the format's: a mistake of the input (luaop test exits 2), not a failing case.
type MalformedTestFileError struct {
	File string
	Err  error // names File:line
}

func (e MalformedTestFileError) Error() string { return e.Err.Error() }
func (e MalformedTestFileError) Unwrap() error { return e.Err }

// Run runs the test cases and writes go-test-like output: "ok"/"FAIL" per case, a
// diff for each failure, and a last line. A test file that does not parse, or
// whose keys are not the format's, is an error naming its file:line.
func Run(ctx context.Context, o Options) (Summary, error) {
	var sum Summary
	scripts, err := scriptsource.ReadDir(o.Scripts)
	if err != nil {
		return sum, err
	}
	prefix := o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	start := time.Now()
	var all []string
	for _, path := range o.Tests {
		data, err := os.ReadFile(path)
		if err != nil {
			return sum, err
		}
		cases, err := decodeFile(path, data)
		if err != nil {
			return sum, MalformedTestFileError{File: path, Err: err}
		}
		for _, c := range cases {
			res := CaseResult{File: path, Name: caseName(c.Case, c.Index), Line: c.Line}
			full := res.FullName()
			all = append(all, full)
			if o.Run != nil && !o.Run.MatchString(full) {
				continue
			}
			t0 := time.Now()
			res.Failures = runCase(ctx, scripts, filepath.Dir(path), prefix, o, c.Case)
			res.Took = time.Since(t0)
			sum.Cases = append(sum.Cases, res)
			took := res.Took.Round(time.Millisecond)
			if len(res.Failures) == 0 {
				sum.Passed++
				if o.Verbose {
					fmt.Fprintf(out, "ok    %s (%s)\n", full, took)
				}
				continue
			}
			sum.Failed++
			fmt.Fprintf(out, "FAIL  %s (%s)\n", full, took)
			for _, f := range res.Failures {
				fmt.Fprintf(out, "    %s\n", strings.ReplaceAll(strings.TrimRight(f, "\n"), "\n", "\n    "))
			}
		}
	}
	sum.Took = time.Since(start)
	if o.Run != nil && len(sum.Cases) == 0 {
		return sum, fmt.Errorf("%w --run %q (of %d case(s): %s)", ErrNoCaseMatches, o.Run.String(), len(all), summarizeNames(all))
	}
	took := sum.Took.Round(time.Millisecond)
	if sum.Failed > 0 {
		fmt.Fprintf(out, "FAIL  %d of %d case(s) failed (%s)\n", sum.Failed, sum.Failed+sum.Passed, took)
	} else {
		fmt.Fprintf(out, "ok    %d case(s) passed (%s)\n", sum.Passed, took)
	}
	return sum, nil
}

// summarizeNames lists a few names, then how many more.
func summarizeNames(names []string) string {
	const shown = 5
	if len(names) <= shown {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:shown], ", ") + fmt.Sprintf(" and %d more", len(names)-shown)
}

// outcome is what running one handler of a case produced.
type outcome struct {
	patch   *state.Patch
	result  any
	err     error
	skipped bool
	// notPart says why a change handler took no part in the cause (no change, its
	// field did not change or is absent), "" when its filters skipped it.
	notPart string
	// problem is what is wrong with the case (a related object the handler's
	// relations do not relate to the object): not the handler's outcome.
	problem string
}

func (o Options) defaultBackoff() time.Duration {
	if o.DefaultBackoff > 0 {
		return o.DefaultBackoff
	}
	return handling.DefaultBackoff
}

func (o Options) handlerTimeout() time.Duration {
	if o.HandlerTimeout > 0 {
		return o.HandlerTimeout
	}
	return DefaultHandlerTimeout
}

// runCase runs one case and returns what did not match its expectations.
func runCase(ctx context.Context, scripts []luabind.Script, dir, prefix string, o Options, c Case) []string {
	kube, err := caseServer(dir, c)
	if err != nil {
		return []string{err.Error()}
	}
	var logs strings.Builder
	rt := luabind.New(luabind.Options{Shards: 1, Kube: kube, HandlerTimeout: o.handlerTimeout(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	defer rt.Close()
	if _, err := rt.Load(ctx, scripts); err != nil {
		return []string{"loading the scripts: " + err.Error()}
	}
	obj, msg := caseObject(dir, c, isHook(rt, c.Handler))
	if msg != "" {
		return []string{msg}
	}
	defaultNamespace(kube, obj)
	var failures []string
	var written any // the handlers' patch, which the operator writes
	if spec, ok := admissionHandler(rt, c.Handler); ok {
		failures = runAdmission(ctx, rt, spec, c, obj)
	} else if msg := admissionOnly(c); msg != "" {
		return []string{msg}
	} else {
		ex, msg := execute(ctx, rt, c, prefix, o.defaultBackoff(), obj)
		if msg != "" {
			return []string{msg}
		}
		failures = checkExecution(c, obj, ex)
		written = normalize(ex.patch.Map())
	}
	failures = append(failures, checkFake(c.Expect, kube)...)
	failures = append(failures, checkOperatorWrite(ctx, kube, obj, written)...)
	if len(failures) > 0 && logs.Len() > 0 {
		failures = append(failures, "log:\n  "+strings.ReplaceAll(strings.TrimRight(logs.String(), "\n"), "\n", "\n  "))
	}
	return failures
}

// isHook tells whether id names an operator hook (startup, cleanup, probe): such a
// handler is tied to no object.
func isHook(rt *luabind.Runtime, id string) bool {
	for _, s := range rt.Hooks() {
		if id != "" && s.ID == id {
			return true
		}
	}
	return false
}

// caseObject is the case's object (inline or from its file), normalized to JSON
// types and given a uid, or what is wrong with the case. A hook's case (hook) needs
// none: hooks are tied to no object (an empty one stands in).
func caseObject(dir string, c Case, hook bool) (map[string]any, string) {
	obj := c.Object
	if c.ObjectFile != "" {
		path := c.ObjectFile
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path) // relative to the test file
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err.Error()
		}
		v, err := yaml12.Unmarshal(data)
		if err != nil {
			return nil, fmt.Sprintf("%s: %v", c.ObjectFile, err)
		}
		if obj, _ = v.(map[string]any); obj == nil {
			return nil, fmt.Sprintf("%s: not a Kubernetes object (a YAML mapping)", c.ObjectFile)
		}
	}
	if obj == nil && hook {
		obj = map[string]any{}
	}
	if obj == nil {
		return nil, "the case gives no object (object: or objectFile:)"
	}
	if (c.Handler == "") == (c.Cause == "") {
		return nil, "give either handler: ID or cause: create|update|delete|resume|related"
	}
	obj = normalize(obj).(map[string]any)
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	if _, ok := meta["uid"]; !ok {
		meta["uid"] = "00000000-0000-0000-0000-000000000001"
	}
	return obj, ""
}

// caseIndexes are the operator's indexes as the case gives them, with every index
// the scripts declare.
func caseIndexes(rt *luabind.Runtime, c Case) *state.Indexes {
	indexes := state.NewIndexes()
	for name, byKey := range c.Indexes {
		indexes.Declare(name)
		for key, values := range byKey {
			for i, v := range values {
				// A key written as JSON (["ns","name"]) is a table key, by value.
				indexes.Set(name, fmt.Sprintf("test/%s/%d", key, i), map[string]any{luabind.IndexKeyFromText(key): v})
			}
		}
	}
	for _, s := range rt.Specs() {
		if s.Kind == causes.KindIndex {
			indexes.Declare(s.ID)
		}
	}
	return indexes
}

// admissionHandler is the validate or mutate handler of id, if it is one.
func admissionHandler(rt *luabind.Runtime, id string) (causes.Spec, bool) {
	for _, s := range rt.AdmissionHandlers() {
		if s.ID == id {
			return s, true
		}
	}
	return causes.Spec{}, false
}

// admissionOnly tells (as a failure message) when a case that runs no admission
// handler gives what only admission cases take.
func admissionOnly(c Case) string {
	if e := c.Expect; e.Given("allowed") || e.Given("message") || e.Given("code") || e.Given("warnings") || c.Operation != "" || c.DryRun || c.UserInfo != nil {
		return "allowed, message, code, warnings, operation, dryRun and userInfo apply to admission handlers (luaop.on.validate, luaop.on.mutate) only"
	}
	return ""
}

// caseSpecs are the handlers a case runs: the one it names (handler:), or every
// change handler of the object's resource serving its cause (cause:), in
// registration order; or what is wrong with the case.
func caseSpecs(rt *luabind.Runtime, c Case, obj map[string]any) ([]causes.Spec, string) {
	var specs []causes.Spec
	if c.Handler != "" {
		for _, s := range append(rt.Specs(), rt.Hooks()...) {
			if s.ID == c.Handler {
				specs = append(specs, s)
			}
		}
		if len(specs) == 0 {
			var ids []string
			for _, s := range rt.Specs() {
				ids = append(ids, s.ID)
			}
			return nil, fmt.Sprintf("no handler %q; the scripts register %s", c.Handler, strings.Join(ids, ", "))
		}
		for _, s := range specs {
			if msg := checkResource(s, obj, c.Resource); msg != "" {
				return nil, msg
			}
		}
		return specs, ""
	}
	reason := causes.Reason(c.Cause)
	for _, s := range rt.Specs() {
		if s.Kind == causes.KindChange && s.Serves(reason) && resourceMatches(s.Resource, obj, c.Resource) {
			specs = append(specs, s)
		}
	}
	if len(specs) == 0 {
		return nil, fmt.Sprintf("no change handler serves %s for %s", c.Cause, obj["apiVersion"])
	}
	return specs, ""
}

// execution is what running a case's handlers produced: the merged patch, the
// handlers that ran (not skipped by their filters), the result of a handler: case
// and the error (a handler: case's, else the first).
type execution struct {
	patch   *state.Patch
	ran     []string
	result  any
	err     error
	skipped bool // a handler: case's handler was skipped by its filters
	// verdict is the operator's on err (handling.Judge, a first attempt of the
	// handler that raised it): retried after a delay, or failed for good.
	verdict handling.Verdict
	// notPart: why the handlers skipped took no part in the cause (see outcome),
	// the last one's; "" when filters skipped them.
	notPart string
}

// execute runs the handlers of a (non-admission) case in order, as the core would
// for one cause, and merges what they wrote.
func execute(ctx context.Context, rt *luabind.Runtime, c Case, prefix string, backoff time.Duration, obj map[string]any) (execution, string) {
	if len(c.Related) > 0 && !isRelatedCase(c) {
		return execution{}, "related: applies to cause: related and to handler: cases of luaop.on.related handlers"
	}
	specs, msg := caseSpecs(rt, c, obj)
	if msg != "" {
		return execution{}, msg
	}
	indexes := caseIndexes(rt, c)
	ex := execution{patch: state.NewPatch(), verdict: handling.Verdict{Outcome: handling.OutcomeSuccess}}
	for _, spec := range specs {
		out := runHandler(ctx, rt, spec, c, prefix, obj, indexes)
		if out.problem != "" {
			return execution{}, out.problem
		}
		if out.skipped {
			if c.Handler != "" {
				ex.skipped = true
			}
			if out.notPart != "" {
				ex.notPart = out.notPart
			}
			continue
		}
		ex.ran = append(ex.ran, spec.ID)
		if out.patch != nil {
			ex.patch.Merge(out.patch.Map())
		}
		if c.Handler != "" || ex.err == nil && out.err != nil {
			ex.err = out.err
			ex.verdict = firstAttemptVerdict(spec, backoff, out.err)
		}
		if c.Handler != "" {
			ex.result = out.result
		}
	}
	return ex, ""
}

// firstAttemptVerdict is the operator's verdict on a first attempt of spec that
// ended with err (handling.Judge, the handler's backoff or the operator's default).
func firstAttemptVerdict(spec causes.Spec, defaultBackoff time.Duration, err error) handling.Verdict {
	return handling.Judge(handling.WithBackoff(spec, defaultBackoff), handling.Attempt{}, err)
}

// checkExecution compares what a case's handlers did with its expectations.
func checkExecution(c Case, obj map[string]any, ex execution) []string {
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	if ex.skipped != c.Expect.Skipped {
		switch {
		case ex.skipped && ex.notPart != "":
			fail("the handler takes no part in the cause: %s (expect skipped: true if that is intended)", ex.notPart)
		case ex.skipped:
			fail("the handler's filters do not match the object (expect skipped: true if that is intended)")
		default:
			fail("want the handler skipped by its filters, but it ran")
		}
	}
	if c.Handler == "" && len(ex.ran) == 0 && !c.Expect.Skipped {
		if ex.notPart != "" {
			fail("no handler takes part in the cause: %s", ex.notPart)
		} else {
			fail("no handler's filters match the object")
		}
	}
	e := c.Expect
	switch {
	case ex.err != nil && e.Error == nil:
		fail("unexpected error: %s", describeError(ex.err))
		if v := ex.verdict; v.Outcome == handling.OutcomeFailure && v.Message != ex.err.Error() {
			// The retries or the time run out at once: the operator would not retry.
			fail("the operator fails the handler for good: %s", v.Message)
		}
	case ex.err == nil && e.Error != nil:
		fail("want an error (%s), got none", e.Error.Type)
	case ex.err != nil:
		if d := checkError(ex.err, e.Error); d != "" {
			fail("%s", d)
		}
	}
	patch := normalize(ex.patch.Map())
	// Given as {} (or null), patch and status assert that nothing was written.
	if e.Given("patch") {
		compare(&failures, "patch", emptyMapIfNil(e.Patch), patch)
	}
	if e.Given("status") {
		status, _ := state.Resolve(patch, []string{"status"})
		compare(&failures, "status (of the patch)", emptyMapIfNil(e.Status), status)
	}
	if e.Given("result") && c.Handler == "" {
		fail("result: is compared only in handler: cases (with cause:, several handlers may run); use status:")
	} else if e.Given("result") {
		// result: null asserts that the handler returned nothing.
		compare(&failures, "result", normalize(e.Result), normalize(ex.result))
	}
	if e.Object != nil {
		if after, err := patchedObject(obj, patch); err != nil {
			fail("applying the patch: %v", err)
		} else {
			compare(&failures, "object (after the patch)", e.Object, after)
		}
	}
	return failures
}

// checkResource tells (as a failure message) when the object of a handler: case is
// not of the handler's resource: its apiVersion must be the resource's group and
// version, and its kind the resource's (by Kubernetes' plural rules, or resource:
// given as the handler's resource for irregular plurals). Handlers without a
// resource (startup, cleanup, probe hooks) take any object.
func checkResource(spec causes.Spec, obj map[string]any, explicit string) string {
	if spec.Resource.Resource == "" {
		return ""
	}
	av, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	if explicit != "" {
		gv, err := schema.ParseGroupVersion(av)
		if explicit == spec.Resource.String() && err == nil && gv == spec.Resource.GroupVersion() {
			return ""
		}
		return fmt.Sprintf("handler %s watches %s, but the case gives resource: %s and an object of apiVersion %q, kind %q",
			spec.ID, spec.Resource, explicit, av, kind)
	}
	if resourceMatches(spec.Resource, obj, "") {
		return ""
	}
	return fmt.Sprintf("handler %s watches %s, but the object is apiVersion %q, kind %q (give resource: %s if the kind's plural is irregular)",
		spec.ID, spec.Resource, av, kind, spec.Resource)
}

// resourceMatches tells whether a handler's resource is the object's.
func resourceMatches(r causes.Resource, obj map[string]any, explicit string) bool {
	if explicit != "" {
		return r.String() == explicit
	}
	av, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	gv, err := schema.ParseGroupVersion(av)
	if err != nil || gv != r.GroupVersion() {
		return false
	}
	plural, _ := meta.UnsafeGuessKindToResource(gv.WithKind(kind))
	return r.Resource == plural.Resource || r.Resource == kind
}

// runHandler runs one handler the way the processing core calls it.
func runHandler(ctx context.Context, rt *luabind.Runtime, spec causes.Spec, c Case, prefix string, obj map[string]any, indexes *state.Indexes) outcome {
	cause := handling.ForObject(spec.Resource, obj)
	if spec.Kind.IsHook() {
		cause = handling.ForHook()
	}
	patch := state.NewPatch()
	call := causes.Call{Handler: spec, Patch: patch, Started: time.Now(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Indexes: indexes}
	switch spec.Kind {
	case causes.KindChange:
		if isRelatedCase(c) {
			view, problem := relatedView(ctx, rt, spec, c, prefix, obj, indexes)
			if problem != "" {
				return outcome{problem: problem}
			}
			cause = view
			break
		}
		view, notPart := changeView(rt.Specs(), spec, c, prefix, obj)
		if notPart != "" {
			return outcome{skipped: true, notPart: notPart}
		}
		cause = view
	case causes.KindEvent:
		eventType := c.EventType
		if eventType == "" {
			eventType = "MODIFIED"
		}
		cause = handling.ForEvent(spec.Resource, obj, eventType)
	}
	call.Cause = cause
	if !spec.Kind.IsHook() {
		ok, err := rt.Match(ctx, spec, cause)
		if err != nil {
			return outcome{err: fmt.Errorf("filter: %w", err)}
		}
		if !ok {
			return outcome{skipped: true}
		}
	}
	if spec.Kind == causes.KindDaemon {
		// One iteration: the first luaop.sleep hands the patch over and stops the
		// daemon (sleep returns false, ctx.stopped() is true); a daemon that goes on
		// is cancelled at its next blocking call, as the operator cancels it.
		stopped, stop := context.WithCancel(ctx)
		defer stop()
		call.Daemon = &causes.DaemonLink{Stopped: stopped, Cancelled: stopped, Latest: func() map[string]any { return obj }}
		call.Daemon.Flush = func(p map[string]any) {
			patch.Merge(p)
			stop()
		}
		err := rt.RunDaemon(ctx, &call)
		if errors.Is(err, causes.ErrDaemonCancelled) {
			err = nil
		}
		return outcome{patch: patch, err: err}
	}
	res, err := rt.Invoke(ctx, call)
	if err == nil {
		handling.StoreResult(patch, spec, res.Value)
	}
	if err == nil && len(res.Subhandlers) > 0 {
		err = runSubhandlers(ctx, rt, call, res.Subhandlers)
	}
	if m, ok := res.Value.(map[string]any); ok && spec.Kind == causes.KindIndex {
		// An index function's table keys read as their JSON (["ns","name"]).
		keyed := make(map[string]any, len(m))
		for k, v := range m {
			keyed[luabind.IndexKeyText(k)] = v
		}
		res.Value = keyed
	}
	return outcome{patch: patch, result: res.Value, err: err}
}

// runSubhandlers runs the subhandlers a handler registered, each once, in order, with
// the parent's cause and patch, as the processing core does right after the parent:
// a subhandler's result goes to status.<parent id>/<child id> (its id), and the
// subhandlers it registers in turn run after it. Every subhandler runs; the first
// error is returned, naming the subhandler.
func runSubhandlers(ctx context.Context, rt *luabind.Runtime, parent causes.Call, subs []causes.Spec) error {
	if msg, tooDeep := handling.NestedTooDeep(parent.Handler.ID); tooDeep {
		return &subhandlerError{id: parent.Handler.ID, err: errors.New(msg)}
	}
	var first error
	for _, sub := range subs {
		call := parent
		call.Handler, call.Started, call.Runtime = sub, time.Now(), 0
		res, err := rt.Invoke(ctx, call)
		if err != nil {
			err = &subhandlerError{id: sub.ID, err: err}
		} else {
			handling.StoreResult(call.Patch, sub, res.Value)
			if len(res.Subhandlers) > 0 {
				err = runSubhandlers(ctx, rt, call, res.Subhandlers)
			}
		}
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// subhandlerError is a subhandler's error, the case's error.
type subhandlerError struct {
	id  string
	err error
}

func (e *subhandlerError) Error() string { return "subhandler " + e.id + " failed: " + e.err.Error() }
func (e *subhandlerError) Unwrap() error { return e.err }

// changeView is the cause a change handler is given for the case, as the core
// builds it (handling): the case's reason (cause:, else the handler's first, or
// update when old is given and the handler serves it), the essences with the
// fields that the resource's change handlers name, and the handler's view of the
// change (a field handler's reduced to its field), or why the handler takes no part
// in it (the core would not run it): the update changes nothing, or the handler's
// field did not change or is absent.
func changeView(all []causes.Spec, spec causes.Spec, c Case, prefix string, obj map[string]any) (causes.Cause, string) {
	reason := causes.Reason(c.Cause)
	if reason == "" {
		reason = spec.Reasons[0]
		if c.Old != nil && spec.Serves(causes.Update) {
			reason = causes.Update
		}
	}
	var ofResource []causes.Spec
	for _, s := range all {
		// One resource may be named by plural, kind or short name: the core merges
		// the spellings before collecting the fields (processing/resources.go).
		if s.Resource == spec.Resource || resourceMatches(s.Resource, obj, c.Resource) && resourceMatches(spec.Resource, obj, c.Resource) {
			ofResource = append(ofResource, s)
		}
	}
	fields := handling.ChangeFields(ofResource)
	statusField := handling.StatusField(prefix)
	var old any
	if c.Old != nil {
		old = handling.Essence(normalize(c.Old).(map[string]any), prefix, statusField, fields)
	}
	base := handling.ChangeCause(reason, spec.Resource, obj, old, handling.Essence(obj, prefix, statusField, fields))
	view, takesPart, _ := handling.View(spec, base, base.Old, base.Diff)
	switch {
	case takesPart:
		return view, ""
	case len(spec.Field) == 0:
		return view, "the update changes nothing (old: and object: have the same essence), and the core runs no handler for an update without a change"
	case reason == causes.Create || reason == causes.Update:
		return view, fmt.Sprintf("its field %s did not change", strings.Join(spec.Field, "."))
	}
	return view, fmt.Sprintf("its field %s is absent", strings.Join(spec.Field, "."))
}

func describeError(err error) string {
	var sub *subhandlerError
	if errors.As(err, &sub) {
		return "subhandler " + sub.id + " failed: " + describeError(sub.err)
	}
	if t, ok := causes.AsTemporary(err); ok {
		return fmt.Sprintf("temporary error %q, retry in %s", t.Message, t.Delay)
	}
	if causes.IsPermanent(err) {
		return fmt.Sprintf("permanent error %q", err.Error())
	}
	return err.Error()
}

func checkError(err error, want *ExpectError) string {
	typ, msg := "error", err.Error()
	var delay *time.Duration
	if t, ok := causes.AsTemporary(err); ok {
		typ, msg, delay = "temporary", t.Message, &t.Delay
	} else if causes.IsPermanent(err) {
		var p *causes.PermanentError
		errors.As(err, &p)
		typ, msg = "permanent", p.Message
	}
	var problems []string
	if want.Type != "" && want.Type != typ {
		problems = append(problems, fmt.Sprintf("error type: want %s, got %s", want.Type, typ))
	}
	if want.Message != "" && !strings.Contains(msg, want.Message) {
		problems = append(problems, fmt.Sprintf("error message: want it to contain %q, got %q", want.Message, msg))
	}
	if want.Delay != nil {
		wantD := time.Duration(*want.Delay * float64(time.Second))
		if delay == nil || *delay != wantD {
			got := "none"
			if delay != nil {
				got = delay.String()
			}
			problems = append(problems, fmt.Sprintf("error delay: want %s, got %s", wantD, got))
		}
	}
	if len(problems) > 0 {
		return strings.Join(problems, "\n") + "\n(the error: " + describeError(err) + ")"
	}
	return ""
}

// normalize makes values comparable: JSON types only (numbers float64).
func normalize(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	_ = json.Unmarshal(data, &out)
	return out
}

func emptyMapIfNil(m map[string]any) any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

func emptyListIfNil(l []map[string]any) any {
	if l == nil {
		return []any{}
	}
	return l
}

// prune keeps of got what want names (non-empty maps as subsets, recursively; an
// empty map in want keeps all of got, so that {} asserts emptiness).
func prune(want, got any) any {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(w) == 0 {
			return got
		}
		out := map[string]any{}
		for k, wv := range w {
			if gv, ok := g[k]; ok {
				out[k] = prune(wv, gv)
			} else if wv == nil {
				out[k] = nil // null in the expectation: absent (or null)
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return got
		}
		out := make([]any, len(g))
		for i := range g {
			out[i] = prune(w[i], g[i])
		}
		return out
	}
	return got
}

// compare adds a failure with a diff when got, reduced to what want names, differs.
func compare(failures *[]string, what string, want, got any) {
	want = normalize(want)
	got = normalize(got)
	if got == nil {
		// Nothing written compares equal to an expected {} or [].
		switch w := want.(type) {
		case map[string]any:
			if len(w) == 0 {
				got = map[string]any{}
			}
		case []any:
			if len(w) == 0 {
				got = []any{}
			}
		}
	}
	pruned := prune(want, got)
	if reflect.DeepEqual(want, pruned) {
		return
	}
	*failures = append(*failures, fmt.Sprintf("%s: (-want +got)\n%s", what, diff(toYAML(want), toYAML(pruned))))
}

func toYAML(v any) string {
	if v == nil {
		return "null\n"
	}
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(data)
}

// diff is a line diff (longest common subsequence), "-" for want, "+" for got.
func diff(a, b string) string {
	x, y := strings.Split(strings.TrimRight(a, "\n"), "\n"), strings.Split(strings.TrimRight(b, "\n"), "\n")
	n, m := len(x), len(y)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out strings.Builder
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && x[i] == y[j]:
			out.WriteString("  " + x[i] + "\n")
			i, j = i+1, j+1
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			out.WriteString("- " + x[i] + "\n")
			i++
		default:
			out.WriteString("+ " + y[j] + "\n")
			j++
		}
	}
	return out.String()
}

// Files lists the test files of a folder: *.yaml and *.yml, sorted.
func Files(dir string) ([]string, error) {
	var files []string
	for _, p := range []string{"*.yaml", "*.yml"} {
		m, err := filepath.Glob(filepath.Join(dir, p))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	sort.Strings(files)
	return files, nil
}

// runAdmission runs a validate or mutate handler on the case's object as the
// webhook server does, and compares its verdict.
func runAdmission(ctx context.Context, rt *luabind.Runtime, spec causes.Spec, c Case, obj map[string]any) []string {
	if msg := checkResource(spec, obj, c.Resource); msg != "" {
		return []string{msg}
	}
	e := c.Expect
	var failures []string
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	op := strings.ToUpper(c.Operation)
	if op == "" {
		op = "CREATE"
		if c.Old != nil {
			op = "UPDATE"
		}
	}
	req := luabind.AdmissionRequest{Handler: spec, Operation: op, Object: obj, DryRun: c.DryRun, UserInfo: c.UserInfo,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if c.Old != nil {
		req.OldObject = normalize(c.Old).(map[string]any)
	}
	if op == "DELETE" {
		req.Object, req.OldObject = nil, obj
	}
	if req.UserInfo == nil {
		req.UserInfo = map[string]any{"username": "luaop-test"}
	}
	if !e.Given("allowed") && e.Error == nil && !e.Skipped {
		return []string{"an admission case needs allowed: true or false (or error: or skipped: true)"}
	}
	resp, err := rt.Admit(ctx, req)
	switch {
	case err != nil && e.Error == nil:
		fail("unexpected error: %s", describeError(err))
	case err == nil && e.Error != nil:
		fail("want an error (%s), got none", e.Error.Type)
	case err != nil:
		if d := checkError(err, e.Error); d != "" {
			fail("%s", d)
		}
		return failures
	}
	if resp.Skipped != e.Skipped {
		if resp.Skipped {
			fail("the handler's filters do not match the object (expect skipped: true if that is intended)")
		} else {
			fail("want the handler skipped by its filters, but it ran")
		}
	}
	if e.Allowed != nil && *e.Allowed != resp.Allowed {
		fail("allowed: want %v, got %v (message %q)", *e.Allowed, resp.Allowed, resp.Message)
	}
	if e.Given("message") && !strings.Contains(resp.Message, e.Message) {
		fail("message: want it to contain %q, got %q", e.Message, resp.Message)
	}
	if e.Given("code") && e.Code != resp.Code {
		fail("code: want %d, got %d", e.Code, resp.Code)
	}
	if e.Given("warnings") {
		compare(&failures, "warnings", normalize(emptyListIfNilStrings(e.Warnings)), normalize(emptyListIfNilStrings(resp.Warnings)))
	}
	patch := normalize(resp.Patch)
	if patch == nil {
		patch = map[string]any{}
	}
	if e.Given("patch") {
		compare(&failures, "patch (ctx.patch)", emptyMapIfNil(e.Patch), patch)
	}
	if e.Object != nil {
		if after, err := patchedObject(obj, patch); err != nil {
			fail("applying the patch: %v", err)
		} else {
			compare(&failures, "object (after the patch)", e.Object, after)
		}
	}
	if e.Given("status") || e.Given("result") {
		fail("status and result do not apply to admission handlers: use allowed, message, code, warnings, patch, object")
	}
	return failures
}

func emptyListIfNilStrings(l []string) []any {
	out := []any{}
	for _, s := range l {
		out = append(out, s)
	}
	return out
}

// patchedObject is obj with the merge patch applied, as the API server would store it.
func patchedObject(obj, patch any) (any, error) {
	a, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return nil, err
	}
	merged, err := jsonpatch.MergePatch(a, b)
	if err != nil {
		return nil, err
	}
	var after any
	err = json.Unmarshal(merged, &after)
	return after, err
}

// Execution is what `luaop test` did for a case, before any expectation is
// compared: the object with the handlers' patch applied, the handlers that ran
// (their filters matched), the error (a handler: case's, else the first) and the
// operator's verdict on it for a first attempt (handling.Judge: the outcome, the
// delay of a retry, the message of a final failure).
type Execution struct {
	Object  map[string]any
	Ran     []string
	Err     error
	Verdict handling.Verdict
}

// Execute runs a case's handlers (not an admission handler's) as Run does, with the
// scripts of o.Scripts and o's prefix and handler timeout, and returns what they
// did: what the table of the core's parity test compares with the processing core.
func Execute(ctx context.Context, o Options, c Case) (Execution, error) {
	scripts, err := scriptsource.ReadDir(o.Scripts)
	if err != nil {
		return Execution{}, err
	}
	prefix := o.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	kube, err := caseServer(o.Scripts, c)
	if err != nil {
		return Execution{}, err
	}
	rt := luabind.New(luabind.Options{Shards: 1, Kube: kube, HandlerTimeout: o.handlerTimeout(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer rt.Close()
	if _, err := rt.Load(ctx, scripts); err != nil {
		return Execution{}, fmt.Errorf("loading the scripts: %w", err)
	}
	obj, msg := caseObject(o.Scripts, c, isHook(rt, c.Handler))
	if msg != "" {
		return Execution{}, errors.New(msg)
	}
	defaultNamespace(kube, obj)
	ex, msg := execute(ctx, rt, c, prefix, o.defaultBackoff(), obj)
	if msg != "" {
		return Execution{}, errors.New(msg)
	}
	after, err := patchedObject(obj, normalize(ex.patch.Map()))
	if err != nil {
		return Execution{}, err
	}
	afterMap, _ := after.(map[string]any)
	return Execution{Object: afterMap, Ran: ex.ran, Err: ex.err, Verdict: ex.verdict}, nil
}
