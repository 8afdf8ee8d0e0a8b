package reloading

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptwatch"
	"github.com/luaop/luaop/testcluster"
)

// The fakes record what the Reloader tells the parts it takes as interfaces; the
// operator loads into a real luabind runtime, so that errors carry file:line as in
// production.

type note struct {
	files []string
	err   error
}

type fakeOperator struct {
	rt *luabind.Runtime
	// gate, when set, holds every load until it receives (a load being applied).
	gate chan struct{}

	mu          sync.Mutex
	inFlight    int
	maxInFlight int
	loaded      []string // the handler ids of each successful load, joined
	notes       []note
	lastGood    []bool
}

func newFakeOperator(t *testing.T) *fakeOperator {
	rt := luabind.New(luabind.Options{Shards: 1, Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(rt.Close)
	return &fakeOperator{rt: rt}
}

func (o *fakeOperator) LoadScripts(ctx context.Context, scripts []luabind.Script) (luabind.LoadReport, error) {
	o.mu.Lock()
	o.inFlight++
	o.maxInFlight = max(o.maxInFlight, o.inFlight)
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.inFlight--
		o.mu.Unlock()
	}()
	if o.gate != nil {
		<-o.gate
	}
	if len(scripts) == 0 {
		return luabind.LoadReport{}, errors.New("no *.lua files")
	}
	rep, err := o.rt.Load(ctx, scripts)
	if err == nil {
		o.mu.Lock()
		o.loaded = append(o.loaded, o.handlers())
		o.mu.Unlock()
	}
	return rep, err
}

// handlers are the ids of the handlers current in the runtime.
func (o *fakeOperator) handlers() string {
	var ids []string
	for _, s := range o.rt.Specs() {
		ids = append(ids, s.ID)
	}
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

func (o *fakeOperator) NoteReload(files []string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.notes = append(o.notes, note{files, err})
}

func (o *fakeOperator) NoteLastGood(serving bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastGood = append(o.lastGood, serving)
}

func (o *fakeOperator) snapshot() (notes []note, lastGood []bool, loaded []string, maxInFlight int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.notes), slices.Clone(o.lastGood), slices.Clone(o.loaded), o.maxInFlight
}

type fakeMetrics struct {
	mu         sync.Mutex
	reloads    []bool
	latencies  []bool // the ok of each ReloadLatency
	unmeasured int    // ReloadLatency calls with no positive duration
}

func (m *fakeMetrics) Reload(ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reloads = append(m.reloads, ok)
}

func (m *fakeMetrics) ReloadLatency(ok bool, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d <= 0 {
		m.unmeasured++
	}
	m.latencies = append(m.latencies, ok)
}

// snapshot gives the loads counted and the latencies observed; a latency observed
// without a positive duration (nothing measured) fails the test.
func (m *fakeMetrics) snapshot(t *testing.T) (reloads, latencies []bool) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.unmeasured > 0 {
		t.Errorf("%d reload latencies observed without a positive duration", m.unmeasured)
	}
	return slices.Clone(m.reloads), slices.Clone(m.latencies)
}

type fakeFollower struct {
	mu sync.Mutex
	n  int
}

func (f *fakeFollower) Resync() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
}

func (f *fakeFollower) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

type fakeLastGood struct {
	mu      sync.Mutex
	stored  []luabind.Script
	loadErr error    // what Load answers, when set
	kept    []string // the hashes offered
}

func (s *fakeLastGood) Keep(scripts []luabind.Script, hash string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored = slices.Clone(scripts)
	s.kept = append(s.kept, hash)
}

func (s *fakeLastGood) Load(context.Context) ([]luabind.Script, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loadErr != nil {
		return nil, s.loadErr
	}
	return slices.Clone(s.stored), nil
}

func (s *fakeLastGood) Name() string { return "ops/scripts-last-good" }

func (s *fakeLastGood) keptHashes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.kept)
}

// recordingView records what the view was shown and hands each Reloaded to
// events.
type recordingView struct {
	mu     sync.Mutex
	loaded []luabind.LoadReport
	events chan Event
}

func newRecordingView() *recordingView { return &recordingView{events: make(chan Event, 16)} }

func (v *recordingView) Loaded(_ string, rep luabind.LoadReport) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.loaded = append(v.loaded, rep)
}

func (v *recordingView) Reloaded(ev Event) { v.events <- ev }

func (v *recordingView) loads() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.loaded)
}

func (v *recordingView) next(t *testing.T) Event {
	t.Helper()
	select {
	case ev := <-v.events:
		return ev
	case <-time.After(30 * time.Second):
		t.Fatal("no reload shown")
		return Event{}
	}
}

// handlerScript registers one handler of that id.
func handlerScript(id string) string {
	return fmt.Sprintf("local luaop = require(\"luaop\")\nluaop.on.create(\"v1/configmaps\", function(ctx) end, { id = %q })\n", id)
}

// brokenScript has a syntax error on its line 3.
const brokenScript = "local luaop = require(\"luaop\")\n\nluaop.on.create(\"v1/configmaps\", function(ctx) end, { id = \"x\" ]\n"

func change(files ...string) scriptwatch.Change {
	ch := scriptwatch.Change{At: time.Now().Add(-time.Millisecond)}
	for i := 0; i < len(files); i += 2 {
		ch.Scripts = append(ch.Scripts, luabind.Script{Name: files[i], Source: []byte(files[i+1])})
		ch.Files = append(ch.Files, files[i])
	}
	ch.Hash = scriptwatch.HashScripts(ch.Scripts)
	return ch
}

// parts are a Reloader's fakes.
type parts struct {
	op       *fakeOperator
	metrics  *fakeMetrics
	webhooks *fakeFollower
	peering  *fakeFollower
	lastGood *fakeLastGood
	view     *recordingView // nil: the outcomes are logged
	logs     *testcluster.LogBuffer
	changes  chan scriptwatch.Change
	reloader *Reloader
}

func newParts(t *testing.T, withView bool, initial scriptwatch.Change) *parts {
	p := &parts{op: newFakeOperator(t), metrics: &fakeMetrics{}, webhooks: &fakeFollower{}, peering: &fakeFollower{},
		lastGood: &fakeLastGood{}, logs: &testcluster.LogBuffer{}, changes: make(chan scriptwatch.Change)}
	opts := Options{Dir: "scripts", Operator: p.op, Metrics: p.metrics, Webhooks: p.webhooks, Peering: p.peering,
		LastGood: p.lastGood, Logger: slog.New(slog.NewTextHandler(p.logs, nil))}
	if withView {
		p.view = newRecordingView()
		opts.View = p.view
	}
	p.reloader = New(opts)
	initial.Files = nil // the first read names no changed files
	p.reloader.initial, p.reloader.changes = initial, p.changes
	return p
}

// run starts Run until the test ends.
func (p *parts) run(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); p.reloader.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A good first load, then a good reload: every part is told once per load, the
// webhooks after the reload only (their server starts after the first load and
// syncs then), the latency observed for the reload from a save only.
func TestGoodLoadAndReload(t *testing.T) {
	p := newParts(t, true, change("a.lua", handlerScript("first")))
	if !p.reloader.First(t.Context()) {
		t.Fatal("First: no scripts serving")
	}
	if p.op.handlers() != "first" || p.view.loads() != 1 {
		t.Fatalf("handlers %q, view loads %d; want first, 1", p.op.handlers(), p.view.loads())
	}
	reloads, latencies := p.metrics.snapshot(t)
	if !slices.Equal(reloads, []bool{true}) || len(latencies) != 0 {
		t.Errorf("metrics after the first load: reloads %v, latencies %v; want [true], none", reloads, latencies)
	}
	if p.webhooks.count() != 0 || p.peering.count() != 1 {
		t.Errorf("after the first load: webhooks resynced %d, peering %d; want 0, 1", p.webhooks.count(), p.peering.count())
	}
	p.run(t)
	p.changes <- change("a.lua", handlerScript("second"))
	ev := p.view.next(t)
	if ev.Err != nil || !slices.Equal(ev.Files, []string{"a.lua"}) || ev.Latency <= 0 || len(ev.Report.Handlers) != 1 {
		t.Fatalf("reload event %+v", ev)
	}
	if p.op.handlers() != "second" {
		t.Errorf("handlers %q after the reload, want second", p.op.handlers())
	}
	reloads, latencies = p.metrics.snapshot(t)
	if !slices.Equal(reloads, []bool{true, true}) || !slices.Equal(latencies, []bool{true}) {
		t.Errorf("metrics: reloads %v, latencies %v; want [true true], [true]", reloads, latencies)
	}
	if p.webhooks.count() != 1 || p.peering.count() != 2 {
		t.Errorf("webhooks resynced %d, peering %d; want 1, 2", p.webhooks.count(), p.peering.count())
	}
	if kept := p.lastGood.keptHashes(); len(kept) != 2 || kept[0] == kept[1] {
		t.Errorf("last good kept %v, want both loads' hashes", kept)
	}
	notes, lastGood, _, _ := p.op.snapshot()
	if len(notes) != 2 || notes[0].err != nil || notes[1].err != nil || !slices.Equal(notes[1].files, []string{"a.lua"}) {
		t.Errorf("operator notes %+v", notes)
	}
	if slices.Contains(lastGood, true) {
		t.Errorf("NoteLastGood %v: the folder's scripts serve", lastGood)
	}
}

// A broken edit keeps the scripts serving: the error names file and line, nothing
// follows the (unchanged) handlers, nothing is kept; luaop run logs it.
func TestBrokenEditKeepsTheLastGoodScripts(t *testing.T) {
	p := newParts(t, false, change("a.lua", handlerScript("good")))
	if !p.reloader.First(t.Context()) {
		t.Fatal("First: no scripts serving")
	}
	p.run(t)
	p.changes <- change("a.lua", brokenScript)
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(p.logs.String(), "reload failed; the previous scripts keep running"), p.logs.String()
	})
	if !strings.Contains(p.logs.String(), "a.lua:3") {
		t.Errorf("the log does not name a.lua:3:\n%s", p.logs.String())
	}
	if p.op.handlers() != "good" {
		t.Errorf("handlers %q after the broken edit, want good", p.op.handlers())
	}
	notes, _, _, _ := p.op.snapshot()
	if last := notes[len(notes)-1]; last.err == nil || !strings.Contains(last.err.Error(), "a.lua:3") {
		t.Errorf("the operator's last note %+v, want the error at a.lua:3", last)
	}
	reloads, latencies := p.metrics.snapshot(t)
	if !slices.Equal(reloads, []bool{true, false}) || !slices.Equal(latencies, []bool{false}) {
		t.Errorf("metrics: reloads %v, latencies %v; want [true false], [false]", reloads, latencies)
	}
	if p.webhooks.count() != 0 || p.peering.count() != 1 || len(p.lastGood.keptHashes()) != 1 {
		t.Errorf("after a broken edit: webhooks %d, peering %d, kept %v; want 0, 1 and the first hash only",
			p.webhooks.count(), p.peering.count(), p.lastGood.keptHashes())
	}
}

// A save made while the previous reload is being applied waits for it: the loads
// never overlap, and they are applied in the order of the saves.
func TestReloadWhileThePreviousIsApplied(t *testing.T) {
	p := newParts(t, true, change("a.lua", handlerScript("v1")))
	if !p.reloader.First(t.Context()) {
		t.Fatal("First: no scripts serving")
	}
	p.op.gate = make(chan struct{})
	p.run(t)
	p.changes <- change("a.lua", handlerScript("v2")) // taken: its load waits at the gate
	second := make(chan struct{})
	go func() { defer close(second); p.changes <- change("a.lua", handlerScript("v3")) }()
	select {
	case <-second:
		t.Fatal("the second save was taken while the first was being applied")
	case <-time.After(50 * time.Millisecond): // the window in which a concurrent reload would start
	}
	p.op.gate <- struct{}{}
	if ev := p.view.next(t); ev.Err != nil || ev.Report.Handlers[0].ID != "v2" {
		t.Fatalf("first reload %+v, want v2", ev)
	}
	<-second
	p.op.gate <- struct{}{}
	if ev := p.view.next(t); ev.Err != nil || ev.Report.Handlers[0].ID != "v3" {
		t.Fatalf("second reload %+v, want v3", ev)
	}
	_, _, loaded, maxInFlight := p.op.snapshot()
	if maxInFlight != 1 || !slices.Equal(loaded, []string{"v1", "v2", "v3"}) {
		t.Errorf("loads %v with at most %d at once; want v1, v2, v3 one at a time", loaded, maxInFlight)
	}
	if kept := p.lastGood.keptHashes(); len(kept) != 3 {
		t.Errorf("last good kept %v, want 3 hashes", kept)
	}
}

// A first load that fails with no last good scripts waits for the fix, every save
// loaded and counted as a reload, its latency observed too (before the Reloader,
// the reloads of a start on broken scripts had no latency); luaop dev shows each
// error, then the scripts in full. A context ending meanwhile ends the wait.
func TestFirstLoadFailsWaitsForTheFix(t *testing.T) {
	p := newParts(t, true, change("a.lua", brokenScript))
	p.reloader.opts.LastGood = nil
	served := make(chan bool, 1)
	go func() { served <- p.reloader.First(t.Context()) }()
	// Nothing serves behind these errors: the view must not say "the previous
	// scripts keep running".
	if ev := p.view.next(t); ev.Err == nil || !strings.Contains(ev.Err.Error(), "a.lua:3") || !ev.NothingServes {
		t.Fatalf("first load shown as %+v, want the error at a.lua:3, nothing serving", ev)
	}
	p.changes <- change("a.lua", "-- still\n"+brokenScript)
	if ev := p.view.next(t); ev.Err == nil || !strings.Contains(ev.Err.Error(), "a.lua:4") || !ev.NothingServes {
		t.Fatalf("second load shown as %+v, want the error at a.lua:4, nothing serving", ev)
	}
	p.changes <- change("a.lua", handlerScript("fixed"))
	if !<-served {
		t.Fatal("First: no scripts serving after the fix")
	}
	if p.op.handlers() != "fixed" || p.view.loads() != 1 {
		t.Errorf("handlers %q, view loads %d; want fixed, shown in full once", p.op.handlers(), p.view.loads())
	}
	reloads, latencies := p.metrics.snapshot(t)
	if !slices.Equal(reloads, []bool{false, false, true}) || !slices.Equal(latencies, []bool{false, true}) {
		t.Errorf("metrics: reloads %v, latencies %v; want [false false true], [false true] (the saves' reloads)", reloads, latencies)
	}
	if p.peering.count() != 1 || p.webhooks.count() != 0 {
		t.Errorf("peering resynced %d, webhooks %d; want 1, 0", p.peering.count(), p.webhooks.count())
	}
	if p.logs.String() != "" {
		t.Errorf("luaop dev logged what the view shows:\n%s", p.logs.String())
	}

	q := newParts(t, false, change("a.lua", brokenScript))
	q.reloader.opts.LastGood = nil
	ctx, cancel := context.WithCancel(t.Context())
	go func() { served <- q.reloader.First(ctx) }()
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(q.logs.String(), "no last good scripts to serve"), q.logs.String()
	})
	cancel()
	if <-served {
		t.Error("First served scripts after its context ended")
	}
}
