package ledger

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/state"
)

// Run is one handler run as the handler recorded it.
type Run struct {
	Handler string
	UID     string
	Object  string // namespace/name
	// Change names what the handler handled ("create g1", "update g1-g2",
	// "size 1-2", "delete g2"); two runs of one handler with one change on one
	// incarnation are the same work done twice.
	Change string
	// Gen is spec.gen of the state the handler saw.
	Gen int64
	// RV is the record's resourceVersion: when it was written.
	RV int64
	// Record names the record (the ConfigMap), for messages.
	Record string
	// RecordUID is the record's uid: one record seen twice (a list after a gap shows
	// it again) is one run. Not its name: a name made by generateName is free again
	// once its record is deleted (the chaos run deletes the records it saw), and a
	// later run's record may get it.
	RecordUID string
}

// Options configure a Ledger.
type Options struct {
	// Prefix is the operator's prefix (annotations, finalizer). Defaults to luaop.dev.
	Prefix string
	// Handlers are the ids of the change handlers whose runs are recorded.
	Handlers []string
	// DeleteHandlers are those of Handlers that serve deletion: the finalizer must not
	// go before each of them ran.
	DeleteHandlers []string
}

// Ledger collects what it observes; its methods are safe for concurrent use.
type Ledger struct {
	opts      Options
	finalizer string
	progress  []state.ProgressStorage
	diffBases []state.DiffBaseStorage

	mu           sync.Mutex
	incarnations map[string]*Incarnation
	order        []string // uids in the order first seen
	runs         []Run
	records      map[string]bool // the records observed, by uid: a list after a gap shows them again
	gaps         int
}

// Incarnation is what the ledger knows of one object's incarnation (uid).
type Incarnation struct {
	UID, Name string // Name is namespace/name
	// Incarnation is spec.incarnation of its first version.
	Incarnation int64
	// Last is its last version seen (the DELETED event's, once deleted).
	Last *unstructured.Unstructured
	// Versions is how many versions were seen.
	Versions int
	// Deleted: its DELETED event was seen; DeletedRV is that event's version.
	Deleted   bool
	DeletedRV int64
	// DeletionSeen: a version in deletion was seen; HeldAtDeletion: the first such
	// version had the operator's finalizer. ReleasedRV is the first version in
	// deletion without it (or the DELETED event's).
	DeletionSeen, HeldAtDeletion bool
	ReleasedRV                   int64
	// FirstHandledGen is spec.gen of the first state stored as handled (its first
	// diff-base): what its creation's cause covered (-1: none yet). Changes made
	// before it are part of the creation, not updates.
	FirstHandledGen int64
	// Runs are its handler runs, in the order of their records.
	Runs []Run
	// stored: handler -> change -> the first version whose bookkeeping shows its success.
	stored map[string]map[string]int64
	// foreign are versions carrying another incarnation's marks (a write meant for an
	// older namesake).
	foreign []string
}

// New makes a ledger.
func New(opts Options) *Ledger {
	if opts.Prefix == "" {
		opts.Prefix = "luaop.dev"
	}
	field := strings.ReplaceAll(opts.Prefix, ".", "_")
	return &Ledger{
		opts:         opts,
		finalizer:    opts.Prefix + "/finalizer",
		progress:     []state.ProgressStorage{state.NewStatusProgress(field), state.NewAnnotationsProgress(opts.Prefix)},
		diffBases:    []state.DiffBaseStorage{state.NewStatusDiffBase(field), state.NewAnnotationsDiffBase(opts.Prefix)},
		incarnations: map[string]*Incarnation{},
		records:      map[string]bool{},
	}
}

// ResourceVersion is a resourceVersion as a number (0 when it is none).
func ResourceVersion(obj *unstructured.Unstructured) int64 {
	rv, _ := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
	return rv
}

// Gap notes that the watch feeding Observe missed versions (it was answered 410 and
// listed again): the checks may then miss a violation, never invent one, since a
// stored success is only ever seen later than it was.
func (l *Ledger) Gap() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gaps++
}

// Relisted notes a gap of the watch feeding Observe (as Gap) whose list again, at
// resourceVersion listRV, showed the objects of the uids in present. An incarnation
// seen live before that the list does not show was deleted in the gap, its DELETED
// event unseen: it is taken as deleted (and its finalizer released) at listRV, an
// upper bound, so that the checks may miss a violation there, never invent one (a
// finalizer still held at the end, when the object is long gone).
func (l *Ledger) Relisted(present map[string]bool, listRV int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gaps++
	for _, uid := range l.order {
		inc := l.incarnations[uid]
		if inc.Versions == 0 || inc.Deleted || present[uid] || ResourceVersion(inc.Last) > listRV {
			continue
		}
		inc.Deleted, inc.DeletedRV = true, listRV
		if inc.ReleasedRV == 0 {
			inc.ReleasedRV = listRV
		}
		for _, r := range inc.Runs {
			if l.isDeleteHandler(r.Handler) {
				l.noteStored(inc, r.Handler, r.Change, inc.ReleasedRV)
			}
		}
	}
}

// Gaps is how many times the watch missed versions.
func (l *Ledger) Gaps() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gaps
}

// Observe takes one version of an object (eventType ADDED, MODIFIED or DELETED).
func (l *Ledger) Observe(eventType string, obj *unstructured.Unstructured) {
	uid := string(obj.GetUID())
	if uid == "" {
		return
	}
	rv := ResourceVersion(obj)
	l.mu.Lock()
	defer l.mu.Unlock()
	inc := l.incarnations[uid]
	if inc == nil {
		inc = &Incarnation{UID: uid, stored: map[string]map[string]int64{}, FirstHandledGen: -1}
		l.incarnations[uid] = inc
		l.order = append(l.order, uid)
	}
	if inc.Versions == 0 { // its first version (a run record may have come first)
		inc.Name = obj.GetNamespace() + "/" + obj.GetName()
		inc.Incarnation, _, _ = unstructured.NestedInt64(obj.Object, "spec", "incarnation")
	}
	inc.Last = obj
	inc.Versions++
	body := obj.Object
	held := false
	for _, f := range obj.GetFinalizers() {
		held = held || f == l.finalizer
	}
	if obj.GetDeletionTimestamp() != nil {
		if !inc.DeletionSeen {
			inc.DeletionSeen, inc.HeldAtDeletion = true, held
		}
		if !held && inc.ReleasedRV == 0 {
			inc.ReleasedRV = rv
		}
	}
	if eventType == "DELETED" {
		inc.Deleted, inc.DeletedRV = true, rv
		if inc.ReleasedRV == 0 {
			inc.ReleasedRV = rv
		}
	}
	l.checkMarks(inc, obj)
	baseGen := int64(-1)
	for _, d := range l.diffBases {
		if essence, found, err := d.Fetch(body); found && err == nil {
			if g, ok, _ := unstructured.NestedInt64(essence, "spec", "gen"); ok {
				baseGen = g
			}
			break
		}
	}
	if baseGen >= 0 && inc.FirstHandledGen < 0 {
		inc.FirstHandledGen = baseGen
	}
	for _, h := range l.opts.Handlers {
		result, _, _ := unstructured.NestedMap(body, "status", h)
		change, _ := result["change"].(string)
		if change == "" || result["uid"] != uid {
			continue
		}
		gen, _ := asInt(result["gen"])
		success := false
		for _, p := range l.progress {
			if rec, found := p.Fetch(body, h); found {
				success = rec.Success
				break
			}
		}
		// Stored: its record says so, or the cause it served is over (the diff-base
		// moved to the state it handled, or past it). A deletion's records are never
		// purged into a diff-base: its release is the end.
		isDelete := strings.HasPrefix(change, "delete")
		if success || !isDelete && baseGen >= gen || isDelete && inc.ReleasedRV != 0 {
			l.noteStored(inc, h, change, rv)
		}
	}
	if inc.ReleasedRV != 0 {
		// Whatever delete handler ran on it is done: its release says so.
		for _, r := range inc.Runs {
			if l.isDeleteHandler(r.Handler) {
				l.noteStored(inc, r.Handler, r.Change, inc.ReleasedRV)
			}
		}
	}
}

func (l *Ledger) noteStored(inc *Incarnation, handler, change string, rv int64) {
	byChange := inc.stored[handler]
	if byChange == nil {
		byChange = map[string]int64{}
		inc.stored[handler] = byChange
	}
	if at, ok := byChange[change]; !ok || rv < at {
		byChange[change] = rv
	}
}

// checkMarks looks for what another incarnation wrote on this one: a handler result
// or annotation stamped with another uid, or a diff-base of another incarnation's
// spec.
func (l *Ledger) checkMarks(inc *Incarnation, obj *unstructured.Unstructured) {
	uid := inc.UID
	where := fmt.Sprintf("%s (uid %s, incarnation %d) at resourceVersion %s", inc.Name, uid, inc.Incarnation, obj.GetResourceVersion())
	for _, h := range l.opts.Handlers {
		if result, ok, _ := unstructured.NestedMap(obj.Object, "status", h); ok {
			if owner, _ := result["uid"].(string); owner != "" && owner != uid {
				inc.foreign = append(inc.foreign, fmt.Sprintf("%s: status.%s was written for uid %s", where, h, owner))
			}
		}
		if owner, ok := obj.GetAnnotations()["ledger.luaop.dev/"+h]; ok && owner != uid {
			inc.foreign = append(inc.foreign, fmt.Sprintf("%s: annotation ledger.luaop.dev/%s was written for uid %s", where, h, owner))
		}
	}
	for _, d := range l.diffBases {
		essence, found, err := d.Fetch(obj.Object)
		if !found || err != nil {
			continue
		}
		if n, ok, _ := unstructured.NestedInt64(essence, "spec", "incarnation"); ok && n != inc.Incarnation {
			inc.foreign = append(inc.foreign, fmt.Sprintf("%s: its last handled state is of incarnation %d", where, n))
		}
	}
}

func (l *Ledger) isDeleteHandler(id string) bool {
	for _, d := range l.opts.DeleteHandlers {
		if d == id {
			return true
		}
	}
	return false
}

// ObserveRun takes one run record; one seen before (by its uid) is ignored.
func (l *Ledger) ObserveRun(r Run) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.RecordUID != "" {
		if l.records[r.RecordUID] {
			return
		}
		l.records[r.RecordUID] = true
	}
	l.runs = append(l.runs, r)
	inc := l.incarnations[r.UID]
	if inc == nil {
		inc = &Incarnation{UID: r.UID, Name: r.Object, stored: map[string]map[string]int64{}, FirstHandledGen: -1}
		l.incarnations[r.UID] = inc
		l.order = append(l.order, r.UID)
	}
	inc.Runs = append(inc.Runs, r)
	if inc.ReleasedRV != 0 && l.isDeleteHandler(r.Handler) {
		l.noteStored(inc, r.Handler, r.Change, inc.ReleasedRV)
	}
}

// RunFromConfigMap reads a run record written by RunScript's helper.
func RunFromConfigMap(cm *unstructured.Unstructured) (Run, bool) {
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if data["handler"] == "" || data["uid"] == "" {
		return Run{}, false
	}
	gen, _ := strconv.ParseInt(data["gen"], 10, 64)
	return Run{Handler: data["handler"], UID: data["uid"], Object: data["object"], Change: data["change"], Gen: gen,
		RV: ResourceVersion(cm), Record: cm.GetName(), RecordUID: string(cm.GetUID())}, true
}

// Runs are the runs observed so far, in the order of their records' versions.
func (l *Ledger) Runs() []Run {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]Run(nil), l.runs...)
	sort.Slice(out, func(i, j int) bool { return out[i].RV < out[j].RV })
	return out
}

// Incarnations are what the ledger knows, in the order first seen (copies).
func (l *Ledger) Incarnations() []Incarnation {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Incarnation, 0, len(l.order))
	for _, uid := range l.order {
		inc := *l.incarnations[uid]
		inc.Runs = append([]Run(nil), inc.Runs...)
		sort.Slice(inc.Runs, func(i, j int) bool { return inc.Runs[i].RV < inc.Runs[j].RV })
		out = append(out, inc)
	}
	return out
}

// Want is a run an incarnation is owed by a handler: one that Match accepts.
type Want struct {
	Handler string
	// Why says what the run is owed for ("the final spec.size 3").
	Why   string
	Match func(Run) bool
}

// Violation is one broken promise.
type Violation struct {
	// Rule is one of the Rule* constants.
	Rule   string
	Detail string
}

func (v Violation) String() string { return v.Rule + ": " + v.Detail }

// The rules Check applies.
const (
	RuleLost      = "change lost"
	RuleRanTwice  = "succeeded handler ran again"
	RuleFinalizer = "finalizer"
	RuleNamesake  = "write on a re-created namesake"
)

// Check applies the rules to what was observed. owed says, per incarnation, the runs
// the final state is owed (no change lost); a nil owed checks the other rules only.
func (l *Ledger) Check(owed func(Incarnation) []Want) []Violation {
	var out []Violation
	for _, inc := range l.Incarnations() {
		l.mu.Lock()
		stored := map[string]map[string]int64{}
		for h, m := range l.incarnations[inc.UID].stored {
			stored[h] = map[string]int64{}
			for c, rv := range m {
				stored[h][c] = rv
			}
		}
		l.mu.Unlock()
		// No succeeded handler run again on the same change: a record written after
		// the first version that shows that handler's success on that change.
		for _, r := range inc.Runs {
			if at, ok := stored[r.Handler][r.Change]; ok && r.RV > at {
				out = append(out, Violation{RuleRanTwice, fmt.Sprintf("%s (uid %s): handler %s ran on %q again (record %s at resourceVersion %d) after its success on it was stored at resourceVersion %d",
					inc.Name, inc.UID, r.Handler, r.Change, r.Record, r.RV, at)})
			}
		}
		// Finalizers: an incarnation held when its deletion started is released only
		// once every delete handler ran, and is released in the end.
		if inc.HeldAtDeletion {
			if inc.ReleasedRV == 0 {
				out = append(out, Violation{RuleFinalizer, fmt.Sprintf("%s (uid %s) is still held by the finalizer in deletion", inc.Name, inc.UID)})
			}
			for _, h := range l.opts.DeleteHandlers {
				ran := false
				for _, r := range inc.Runs {
					ran = ran || r.Handler == h && (inc.ReleasedRV == 0 || r.RV < inc.ReleasedRV)
				}
				if !ran && inc.ReleasedRV != 0 {
					out = append(out, Violation{RuleFinalizer, fmt.Sprintf("%s (uid %s): the finalizer was released at resourceVersion %d before delete handler %s ran",
						inc.Name, inc.UID, inc.ReleasedRV, h)})
				}
			}
		}
		l.mu.Lock()
		foreign := append([]string(nil), l.incarnations[inc.UID].foreign...)
		l.mu.Unlock()
		for _, f := range foreign {
			out = append(out, Violation{RuleNamesake, f})
		}
		if owed == nil {
			continue
		}
		for _, w := range owed(inc) {
			found := false
			for _, r := range inc.Runs {
				found = found || r.Handler == w.Handler && w.Match(r)
			}
			if !found {
				out = append(out, Violation{RuleLost, fmt.Sprintf("%s (uid %s): handler %s never ran for %s (its runs: %s)", inc.Name, inc.UID, w.Handler, w.Why, runsOf(inc.Runs, w.Handler))})
			}
		}
	}
	return out
}

func runsOf(runs []Run, handler string) string {
	var s []string
	for _, r := range runs {
		if r.Handler == handler {
			s = append(s, fmt.Sprintf("%q@%d", r.Change, r.RV))
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func asInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case float64:
		return int64(n), true
	case int:
		return int64(n), true
	}
	return 0, false
}
