package processing

import (
	"slices"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

func tp(t time.Time) *time.Time { return &t }

// handler builds a handler state; opts tweak its record.
func handler(id string, opts ...func(*state.HandlerRecord)) handlerState {
	var rec state.HandlerRecord
	for _, o := range opts {
		o(&rec)
	}
	return handlerState{spec: causes.Spec{ID: id, Kind: causes.KindChange}, record: rec, found: len(opts) > 0}
}

func retries(n int) func(*state.HandlerRecord) {
	return func(r *state.HandlerRecord) { r.Retries = n }
}

func delayedBy(d time.Duration) func(*state.HandlerRecord) {
	return func(r *state.HandlerRecord) { r.Delayed = tp(t0.Add(d)) }
}

func succeeded(r *state.HandlerRecord) { r.Success, r.Stopped = true, tp(t0) }

func failed(r *state.HandlerRecord) { r.Failure, r.Stopped = true, tp(t0) }

func ids(hs []handlerState) []string {
	out := make([]string, len(hs))
	for i, x := range hs {
		out[i] = x.spec.ID
	}
	return out
}

func TestSelectToRun(t *testing.T) {
	tests := []struct {
		name      string
		lifecycle Lifecycle
		handlers  []handlerState
		want      []string
	}{
		// asap (kopf's default): one handler, the fewest retries first, ties in registration order.
		{name: "asap: nothing registered", lifecycle: LifecycleAsap, handlers: nil, want: nil},
		{name: "asap: all fresh runs the first registered", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a"), handler("b"), handler("c")}, want: []string{"a"}},
		{name: "asap: fewest retries first", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", retries(2)), handler("b", retries(0)), handler("c", retries(1))}, want: []string{"b"}},
		{name: "asap: ties keep registration order", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", retries(1)), handler("b", retries(1)), handler("c", retries(0)), handler("d", retries(0))}, want: []string{"c"}},
		{name: "asap: a handler retried after its delay waits behind fresh ones", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", retries(1), delayedBy(-time.Minute)), handler("b")}, want: []string{"b"}},
		{name: "asap: sleeping handlers are skipped even with fewer retries", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", retries(0), delayedBy(time.Minute)), handler("b", retries(3))}, want: []string{"b"}},
		{name: "asap: finished handlers are skipped", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", succeeded), handler("b", failed), handler("c", retries(5))}, want: []string{"c"}},
		{name: "asap: a delay that is due now is awake", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", retries(1), delayedBy(0))}, want: []string{"a"}},
		{name: "asap: all sleeping runs nothing", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", delayedBy(time.Second)), handler("b", delayedBy(time.Hour))}, want: nil},
		{name: "asap: all finished runs nothing", lifecycle: LifecycleAsap,
			handlers: []handlerState{handler("a", succeeded), handler("b", failed)}, want: nil},
		{name: "an unknown lifecycle behaves as asap", lifecycle: Lifecycle("sometimes"),
			handlers: []handlerState{handler("a", retries(1)), handler("b")}, want: []string{"b"}},

		// one-by-one: one handler, registration order, retries do not matter.
		{name: "one-by-one: first registered even with more retries", lifecycle: LifecycleOneByOne,
			handlers: []handlerState{handler("a", retries(2)), handler("b"), handler("c")}, want: []string{"a"}},
		{name: "one-by-one: finished ones are skipped", lifecycle: LifecycleOneByOne,
			handlers: []handlerState{handler("a", succeeded), handler("b", failed), handler("c", retries(4)), handler("d")}, want: []string{"c"}},
		{name: "one-by-one: sleeping ones are skipped", lifecycle: LifecycleOneByOne,
			handlers: []handlerState{handler("a", delayedBy(time.Minute)), handler("b", retries(1)), handler("c")}, want: []string{"b"}},
		{name: "one-by-one: all sleeping runs nothing", lifecycle: LifecycleOneByOne,
			handlers: []handlerState{handler("a", delayedBy(time.Minute))}, want: nil},

		// all-at-once: every awake handler, in registration order.
		{name: "all-at-once: every fresh handler", lifecycle: LifecycleAllAtOnce,
			handlers: []handlerState{handler("a"), handler("b"), handler("c")}, want: []string{"a", "b", "c"}},
		{name: "all-at-once: keeps registration order regardless of retries", lifecycle: LifecycleAllAtOnce,
			handlers: []handlerState{handler("a", retries(3)), handler("b"), handler("c", retries(1))}, want: []string{"a", "b", "c"}},
		{name: "all-at-once: sleeping and finished excluded", lifecycle: LifecycleAllAtOnce,
			handlers: []handlerState{handler("a"), handler("b", delayedBy(time.Minute)), handler("c", succeeded), handler("d", retries(1), delayedBy(-time.Second)), handler("e", failed)},
			want:     []string{"a", "d"}},
		{name: "all-at-once: all finished runs nothing", lifecycle: LifecycleAllAtOnce,
			handlers: []handlerState{handler("a", succeeded)}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := slices.Clone(tt.handlers)
			got := selectToRun(tt.lifecycle, tt.handlers, t0)
			if !slices.Equal(ids(got), tt.want) && !(len(got) == 0 && len(tt.want) == 0) {
				t.Errorf("selectToRun = %v, want %v", ids(got), tt.want)
			}
			if !slices.Equal(ids(tt.handlers), ids(input)) {
				t.Errorf("selectToRun reordered its input: %v, was %v", ids(tt.handlers), ids(input))
			}
			for _, x := range got {
				if !x.record.Awake(t0) {
					t.Errorf("selected %s, which is not awake", x.spec.ID)
				}
			}
		})
	}
}

// kopf's randomized runs one awake handler per cycle, chosen at random; shuffled
// runs every awake one, in a random order. The choice is pick's (scripted here);
// finished and sleeping handlers are never chosen, and the input is not reordered.
func TestSelectToRunRandomizedAndShuffled(t *testing.T) {
	states := []handlerState{handler("a"), handler("b", succeeded), handler("c"), handler("d", delayedBy(time.Minute)), handler("e")}
	input := ids(states)
	var asked []int
	picks := []int{2, 0, 1}
	pick := func(n int) int {
		asked = append(asked, n)
		p := picks[0]
		picks = picks[1:]
		return p
	}
	if got := ids(selectToRunWith(LifecycleRandomized, states, t0, pick)); !slices.Equal(got, []string{"e"}) {
		t.Errorf("randomized with pick 2 of the awake [a c e] = %v, want [e]", got)
	}
	// Fisher-Yates over [a c e]: swap 2 with pick(3)=0 -> [e c a], swap 1 with pick(2)=1 -> [e c a].
	if got := ids(selectToRunWith(LifecycleShuffled, states, t0, pick)); !slices.Equal(got, []string{"e", "c", "a"}) {
		t.Errorf("shuffled = %v, want [e c a]", got)
	}
	if !slices.Equal(asked, []int{3, 3, 2}) {
		t.Errorf("pick asked for %v, want [3 3 2] (only the awake handlers are drawn from)", asked)
	}
	if !slices.Equal(ids(states), input) {
		t.Errorf("the input was reordered: %v", ids(states))
	}
	for _, name := range []string{"randomized", "shuffled", "asap", "one-by-one", "all-at-once"} {
		if _, err := ParseLifecycle(name); err != nil {
			t.Errorf("ParseLifecycle(%q): %v", name, err)
		}
	}
	if _, err := ParseLifecycle("sometimes"); err == nil {
		t.Error("ParseLifecycle accepts an unknown lifecycle")
	}
}

// Driving asap over several cycles: each handler gets its turn, failing ones fall back
// behind those that have not failed as often.
func TestSelectToRunAsapRotatesFailingHandlers(t *testing.T) {
	states := []handlerState{handler("a"), handler("b"), handler("c")}
	var order []string
	now := t0
	for cycle := 0; cycle < 6 && !allFinished(states); cycle++ {
		sel := selectToRun(LifecycleAsap, states, now)
		if len(sel) != 1 {
			t.Fatalf("cycle %d: selected %v, want exactly one", cycle, ids(sel))
		}
		id := sel[0].spec.ID
		order = append(order, id)
		i := indexOf(states, id)
		var err error
		if id == "a" && states[i].record.Retries < 2 {
			err = &causes.TemporaryError{Message: "not yet", Delay: 0}
		}
		states[i].record, _ = foldOutcome(states[i].spec, states[i].record, now, err)
		now = now.Add(time.Second)
	}
	want := []string{"a", "b", "c", "a", "a"}
	if !slices.Equal(order, want) {
		t.Errorf("run order = %v, want %v", order, want)
	}
	if !allFinished(states) {
		t.Errorf("not all finished after %v", order)
	}
}

func TestAllFinished(t *testing.T) {
	tests := []struct {
		name     string
		handlers []handlerState
		want     bool
	}{
		{name: "no handlers", handlers: nil, want: true},
		{name: "all succeeded", handlers: []handlerState{handler("a", succeeded), handler("b", succeeded)}, want: true},
		{name: "succeeded and failed for good", handlers: []handlerState{handler("a", succeeded), handler("b", failed)}, want: true},
		{name: "one never ran", handlers: []handlerState{handler("a", succeeded), handler("b")}, want: false},
		{name: "one sleeping", handlers: []handlerState{handler("a", succeeded), handler("b", retries(1), delayedBy(time.Minute))}, want: false},
		{name: "one due for a retry", handlers: []handlerState{handler("a", retries(2), delayedBy(-time.Minute)), handler("b", failed)}, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := allFinished(tt.handlers); got != tt.want {
				t.Errorf("allFinished = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestEarliestWakeup(t *testing.T) {
	tests := []struct {
		name     string
		handlers []handlerState
		want     time.Duration // from t0
		wantOK   bool
	}{
		{name: "no handlers", handlers: nil},
		{name: "no delays", handlers: []handlerState{handler("a"), handler("b", retries(1))}},
		{name: "one sleeping", handlers: []handlerState{handler("a"), handler("b", delayedBy(30*time.Second))}, want: 30 * time.Second, wantOK: true},
		{name: "the soonest of several", handlers: []handlerState{
			handler("a", delayedBy(time.Hour)), handler("b", delayedBy(10*time.Second)), handler("c", delayedBy(time.Minute)),
		}, want: 10 * time.Second, wantOK: true},
		{name: "delays already due are not wake-ups", handlers: []handlerState{
			handler("a", delayedBy(-time.Minute)), handler("b", delayedBy(0)), handler("c", delayedBy(5*time.Minute)),
		}, want: 5 * time.Minute, wantOK: true},
		{name: "finished handlers' delays are ignored", handlers: []handlerState{
			handler("a", delayedBy(time.Second), succeeded), handler("b", delayedBy(2*time.Second), failed), handler("c", delayedBy(time.Minute)),
		}, want: time.Minute, wantOK: true},
		{name: "only finished with delays", handlers: []handlerState{handler("a", delayedBy(time.Second), succeeded)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := earliestWakeup(tt.handlers, t0)
			if ok != tt.wantOK {
				t.Fatalf("earliestWakeup ok = %v, want %v (at %v)", ok, tt.wantOK, got)
			}
			if ok && !got.Equal(t0.Add(tt.want)) {
				t.Errorf("earliestWakeup = now+%v, want now+%v", got.Sub(t0), tt.want)
			}
		})
	}
}
