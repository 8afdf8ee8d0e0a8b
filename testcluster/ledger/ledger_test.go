package ledger

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// version builds one version of widget w (uid, resourceVersion rv, spec.gen gen,
// incarnation 1) with the given status results, progress records (status storage)
// and diff-base generation (-1: none).
type version struct {
	uid        string
	rv         int64
	gen        int64
	results    map[string]string // handler -> change (gen = the version's gen)
	success    []string          // handlers whose record says success
	baseGen    int64
	finalizer  bool
	deleting   bool
	inc        int64
	annotation map[string]string
	listed     []string // a RELISTED event's: the uids the list showed
}

func (v version) object() *unstructured.Unstructured {
	status := map[string]any{}
	for h, change := range v.results {
		status[h] = map[string]any{"change": change, "gen": v.gen, "uid": v.uid}
	}
	book := map[string]any{}
	if len(v.success) > 0 {
		progress := map[string]any{}
		for _, h := range v.success {
			progress[h] = map[string]any{"success": true}
		}
		book["progress"] = progress
	}
	inc := v.inc
	if inc == 0 {
		inc = 1
	}
	if v.baseGen >= 0 {
		data, _ := json.Marshal(map[string]any{"spec": map[string]any{"gen": v.baseGen, "incarnation": inc}})
		book["last-handled-configuration"] = string(data)
	}
	if len(book) > 0 {
		status["luaop_dev"] = book
	}
	meta := map[string]any{"name": "w", "namespace": "ns", "uid": v.uid, "resourceVersion": fmt.Sprint(v.rv)}
	if v.finalizer {
		meta["finalizers"] = []any{"luaop.dev/finalizer"}
	}
	if v.deleting {
		meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
	}
	if v.annotation != nil {
		a := map[string]any{}
		for k, x := range v.annotation {
			a[k] = x
		}
		meta["annotations"] = a
	}
	spec := map[string]any{"gen": v.gen, "incarnation": int64(1)}
	if v.uid == "u2" {
		spec["incarnation"] = int64(2)
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
		"metadata": meta, "spec": spec, "status": status}}
}

// observe hands the ledger one event of TestCheck's: a version, or a list after a gap.
func observe(l *Ledger, typ string, v version) {
	if typ != "RELISTED" {
		l.Observe(typ, v.object())
		return
	}
	uids := map[string]bool{}
	for _, uid := range v.listed {
		uids[uid] = true
	}
	l.Relisted(uids, v.rv)
}

func run(h, uid, change string, rv int64) Run {
	return Run{Handler: h, UID: uid, Object: "ns/w", Change: change, RV: rv, Record: fmt.Sprintf("run-%d", rv), RecordUID: fmt.Sprintf("record-%d", rv)}
}

// A record seen twice (a list after a gap) is one run; two records of one generated
// name (the first deleted, its name drawn again) are two. Before, the second was
// ignored: the chaos run reported changes lost (a create handler "never ran").
func TestObserveRunOncePerRecord(t *testing.T) {
	record := func(name, uid, rv, handler, objUID string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv},
			"data":     map[string]any{"handler": handler, "uid": objUID, "object": "ns/w", "change": "create g1", "gen": "1"}}}
	}
	l := New(Options{Handlers: []string{"made", "other"}})
	for _, cm := range []*unstructured.Unstructured{
		record("run-abcde", "cm-1", "10", "made", "u1"),
		record("run-abcde", "cm-1", "10", "made", "u1"),  // listed again after a gap
		record("run-abcde", "cm-2", "20", "other", "u2"), // the name drawn again, for another run
	} {
		run, ok := RunFromConfigMap(cm)
		if !ok {
			t.Fatalf("not a run record: %v", cm)
		}
		l.ObserveRun(run)
	}
	runs := l.Runs()
	if len(runs) != 2 || runs[0].Handler != "made" || runs[1].Handler != "other" {
		t.Fatalf("runs %+v, want made (once) and other", runs)
	}
}

func TestCheck(t *testing.T) {
	opts := Options{Handlers: []string{"made", "changed", "gone"}, DeleteHandlers: []string{"gone"}}
	type event struct {
		typ string // ADDED, MODIFIED, DELETED; RELISTED: a list after a gap, at v.rv, showing v.listed
		v   version
	}
	for _, tc := range []struct {
		name   string
		events []event
		runs   []Run
		owed   func(Incarnation) []Want
		want   []string // rules broken, in order
	}{
		{
			name: "a run before its success was stored, and one after: ran twice",
			events: []event{
				{"ADDED", version{uid: "u1", rv: 10, gen: 1, baseGen: -1}},
				{"MODIFIED", version{uid: "u1", rv: 12, gen: 1, baseGen: -1, results: map[string]string{"made": "create g1"}, success: []string{"made"}}},
			},
			runs: []Run{run("made", "u1", "create g1", 11), run("made", "u1", "create g1", 13)},
			want: []string{RuleRanTwice},
		},
		{
			name: "a run again while its success was not stored (killed before the write): fine",
			events: []event{
				{"ADDED", version{uid: "u1", rv: 10, gen: 1, baseGen: -1}},
				{"MODIFIED", version{uid: "u1", rv: 14, gen: 1, baseGen: 1, results: map[string]string{"made": "create g1"}}},
			},
			runs: []Run{run("made", "u1", "create g1", 11), run("made", "u1", "create g1", 13)},
		},
		{
			name: "the cause over (diff-base at the handled generation) stores the success, records purged",
			events: []event{
				{"ADDED", version{uid: "u1", rv: 10, gen: 1, baseGen: 1}},
				{"MODIFIED", version{uid: "u1", rv: 20, gen: 2, baseGen: 2, results: map[string]string{"changed": "update g1-g2"}}},
			},
			runs: []Run{run("changed", "u1", "update g1-g2", 19), run("changed", "u1", "update g1-g2", 21)},
			want: []string{RuleRanTwice},
		},
		{
			name: "another change handled later is no re-run",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 20, gen: 2, baseGen: 2, results: map[string]string{"changed": "update g1-g2"}}},
			},
			runs: []Run{run("changed", "u1", "update g1-g2", 19), run("changed", "u1", "update g2-g3", 25)},
		},
		{
			name: "released after the delete handler ran: fine; a run after the release: ran twice",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
				{"MODIFIED", version{uid: "u1", rv: 32, gen: 2, baseGen: 2, deleting: true}},
				{"DELETED", version{uid: "u1", rv: 32, gen: 2, baseGen: 2, deleting: true}},
			},
			runs: []Run{run("gone", "u1", "delete g2", 31), run("gone", "u1", "delete g2", 40)},
			want: []string{RuleRanTwice},
		},
		{
			name: "released before the delete handler ran",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
				{"DELETED", version{uid: "u1", rv: 32, gen: 2, baseGen: 2, deleting: true}},
			},
			want: []string{RuleFinalizer},
		},
		{
			name: "held in deletion at the end",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
			},
			runs: []Run{run("gone", "u1", "delete g2", 31)},
			want: []string{RuleFinalizer},
		},
		{
			name: "deleted while the watch was down (a list after a 410 no longer shows it), the delete handler ran: fine",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
				{"RELISTED", version{rv: 40}},
			},
			runs: []Run{run("gone", "u1", "delete g2", 31)},
		},
		{
			name: "deleted while the watch was down, no delete handler run: released before it ran",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
				{"RELISTED", version{rv: 40}},
			},
			want: []string{RuleFinalizer},
		},
		{
			name: "still listed after the gap, held in deletion: still held",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
				{"RELISTED", version{rv: 40, listed: []string{"u1"}}},
			},
			runs: []Run{run("gone", "u1", "delete g2", 31)},
			want: []string{RuleFinalizer},
		},
		{
			name: "deleted in the gap, the delete handler ran again after the list: ran twice",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 30, gen: 2, baseGen: 2, finalizer: true, deleting: true}},
				{"RELISTED", version{rv: 40}},
			},
			runs: []Run{run("gone", "u1", "delete g2", 31), run("gone", "u1", "delete g2", 41)},
			want: []string{RuleRanTwice},
		},
		{
			name: "an older namesake's stamps on a re-created object",
			events: []event{
				{"ADDED", version{uid: "u2", rv: 50, gen: 1, baseGen: -1, annotation: map[string]string{"ledger.luaop.dev/made": "u1"}}},
				{"MODIFIED", version{uid: "u2", rv: 51, gen: 1, baseGen: 1, inc: 1}},
			},
			want: []string{RuleNamesake, RuleNamesake},
		},
		{
			name: "a change owed and never handled",
			events: []event{
				{"MODIFIED", version{uid: "u1", rv: 20, gen: 3, baseGen: 3}},
			},
			runs: []Run{run("changed", "u1", "update g1-g2", 19)},
			owed: func(inc Incarnation) []Want {
				return []Want{{Handler: "changed", Why: "spec.gen 3", Match: func(r Run) bool { return strings.HasSuffix(r.Change, "-g3") }}}
			},
			want: []string{RuleLost},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := New(opts)
			// Runs and versions arrive on two watches, in any order: runs first here.
			for _, r := range tc.runs {
				l.ObserveRun(r)
			}
			for _, e := range tc.events {
				observe(l, e.typ, e.v)
			}
			var got []string
			for _, v := range l.Check(tc.owed) {
				got = append(got, v.Rule)
				t.Log(v)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("rules broken: %v, want %v", got, tc.want)
			}
			// The same with the versions first.
			l = New(opts)
			for _, e := range tc.events {
				observe(l, e.typ, e.v)
			}
			for _, r := range tc.runs {
				l.ObserveRun(r)
			}
			got = nil
			for _, v := range l.Check(tc.owed) {
				got = append(got, v.Rule)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("versions first: rules broken: %v, want %v", got, tc.want)
			}
		})
	}
}
