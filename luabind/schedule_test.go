package luabind

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// The rules of a shard's turns (stateLock), on a fake clock: every step is an
// operation of the test's goroutine, and its outcome is read at once (who holds
// the state, who waits in which order, how often the holder was asked to give it
// back, whether it must), so nothing depends on timing.
func TestStateLockTurns(t *testing.T) {
	const ms = time.Millisecond
	type op struct {
		do    string // join, release, leave (give up waiting), step (the clock)
		who   string
		slice time.Duration // join: the joiner's slice (0: firstSlice)
		d     time.Duration // step
		// After the operation:
		holder string   // who holds the state ("" free)
		line   []string // who waits, in order
		asked  int      // preemption requests so far
		due    bool     // the holder must give the state back now (yieldDue)
	}
	for _, tt := range []struct {
		name string
		ops  []op
	}{
		{"a free state is taken at once and freed by its holder", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "release", holder: ""},
			{do: "join", who: "b", holder: "b"},
		}},
		{"nobody waiting: the holder is never asked", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "step", d: time.Hour, holder: "a"},
		}},
		{"a call waiting: the holder is asked once its slice is over, not before", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "step", d: 9 * ms, holder: "a", line: []string{"b"}},
			{do: "step", d: ms, holder: "a", line: []string{"b"}, asked: 1, due: true},
			{do: "release", holder: "b", asked: 1},
		}},
		{"a holder past its slice is asked at once when a call comes", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "step", d: time.Hour, holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}, asked: 1, due: true},
		}},
		{"one request per hold while it is not due", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "join", who: "c", holder: "a", line: []string{"b", "c"}},
			{do: "step", d: 10 * ms, holder: "a", line: []string{"b", "c"}, asked: 1, due: true},
		}},
		{"the state goes in the order it was asked for, the holder going back in line last", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "join", who: "c", holder: "a", line: []string{"b", "c"}},
			{do: "release", holder: "b", line: []string{"c"}},
			{do: "join", who: "a", holder: "b", line: []string{"c", "a"}},
			{do: "release", holder: "c", line: []string{"a"}},
			{do: "release", holder: "a"},
			{do: "release", holder: ""},
		}},
		{"each new holder with calls behind it gets a slice of its own", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "join", who: "c", holder: "a", line: []string{"b", "c"}},
			{do: "step", d: 10 * ms, holder: "a", line: []string{"b", "c"}, asked: 1, due: true},
			{do: "release", holder: "b", line: []string{"c"}, asked: 1},
			{do: "step", d: 9 * ms, holder: "b", line: []string{"c"}, asked: 1},
			{do: "step", d: ms, holder: "b", line: []string{"c"}, asked: 2, due: true},
		}},
		{"a preempted call's later turns are short: it is asked after laterSlice", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "step", d: 10 * ms, holder: "a", line: []string{"b"}, asked: 1, due: true},
			{do: "release", holder: "b", asked: 1},
			{do: "join", who: "a", slice: laterSlice, holder: "b", line: []string{"a"}, asked: 1},
			{do: "release", holder: "a", asked: 1},
			{do: "join", who: "c", holder: "a", line: []string{"c"}, asked: 1},
			{do: "step", d: ms, holder: "a", line: []string{"c"}, asked: 2, due: true},
		}},
		{"a timer of an earlier hold does not ask the next holder", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "step", d: 5 * ms, holder: "a", line: []string{"b"}},
			{do: "release", holder: "b"},
			{do: "step", d: 5 * ms, holder: "b"}, // a's timer fires: void
			{do: "join", who: "c", holder: "b", line: []string{"c"}},
			{do: "step", d: 4 * ms, holder: "b", line: []string{"c"}},
			{do: "step", d: ms, holder: "b", line: []string{"c"}, asked: 1, due: true},
		}},
		{"a call giving up leaves the line", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "join", who: "c", holder: "a", line: []string{"b", "c"}},
			{do: "leave", who: "b", holder: "a", line: []string{"c"}},
			{do: "release", holder: "c"},
		}},
		{"a call granted the state as it gives up passes it on", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "join", who: "c", holder: "a", line: []string{"b", "c"}},
			{do: "release", holder: "b", line: []string{"c"}},
			{do: "leave", who: "b", holder: "c"},
		}},
		{"the last call giving up leaves nobody to ask for", []op{
			{do: "join", who: "a", holder: "a"},
			{do: "join", who: "b", holder: "a", line: []string{"b"}},
			{do: "leave", who: "b", holder: "a"},
			{do: "step", d: time.Hour, holder: "a", asked: 1}, // the timer's request: a hint
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
			asked := 0
			l := newStateLock(clk, func() { asked++ })
			holder := ""
			waiters := map[string]*stateWaiter{}
			var line []string
			for i, o := range tt.ops {
				switch o.do {
				case "join":
					slice := o.slice
					if slice == 0 {
						slice = firstSlice
					}
					if w := l.join(slice); w != nil {
						waiters[o.who] = w
						line = append(line, o.who)
					} else {
						holder = o.who
					}
				case "release":
					holder = ""
					l.release()
				case "leave":
					w := waiters[o.who]
					delete(waiters, o.who)
					line = slices.DeleteFunc(line, func(s string) bool { return s == o.who })
					if l.leave(w) { // granted meanwhile: it holds the state, and passes it on
						holder = ""
						l.release()
					}
				case "step":
					clk.Step(o.d)
				}
				// Whoever was granted the state meanwhile holds it now.
				for who, w := range waiters {
					select {
					case <-w.granted:
						if holder != "" {
							t.Fatalf("op %d (%s %s): %s was granted the state while %s holds it", i, o.do, o.who, who, holder)
						}
						holder = who
						delete(waiters, who)
						line = slices.DeleteFunc(line, func(s string) bool { return s == who })
					default:
					}
				}
				if holder != o.holder || !slices.Equal(line, o.line) || l.waiting() != len(o.line) {
					t.Fatalf("op %d (%s %s): holder %q, line %v (%d waiting); want %q, %v", i, o.do, o.who, holder, line, l.waiting(), o.holder, o.line)
				}
				if asked != o.asked {
					t.Fatalf("op %d (%s %s): the holder was asked %d times, want %d", i, o.do, o.who, asked, o.asked)
				}
				if holder != "" && l.yieldDue() != o.due {
					t.Fatalf("op %d (%s %s): yieldDue = %v, want %v", i, o.do, o.who, !o.due, o.due)
				}
			}
		})
	}
}

// A call's deadline counts its own time only: the time it is paused (waiting for
// its state) is not spent, and the budget ends the context exactly when the
// running time reaches it.
func TestCallDeadlineCountsOwnTime(t *testing.T) {
	const ms = time.Millisecond
	type op struct {
		do string // run (the clock moves while running), wait (paused while the clock moves), cancel, parent
		d  time.Duration
		// After the operation:
		err  error // the context's Err
		left time.Duration
	}
	for _, tt := range []struct {
		name string
		ops  []op
	}{
		{"running spends the budget", []op{
			{do: "run", d: 60 * ms, left: 40 * ms},
			{do: "run", d: 39 * ms, left: ms},
			{do: "run", d: ms, err: context.DeadlineExceeded},
		}},
		{"waiting for the state spends nothing", []op{
			{do: "run", d: 60 * ms, left: 40 * ms},
			{do: "wait", d: time.Hour, left: 40 * ms},
			{do: "run", d: 39 * ms, left: ms},
			{do: "wait", d: time.Hour, left: ms},
			{do: "run", d: ms, err: context.DeadlineExceeded},
		}},
		{"a budget spent while it waited ends it when it runs again", []op{
			{do: "run", d: 100 * ms, err: context.DeadlineExceeded},
			{do: "wait", d: time.Hour, err: context.DeadlineExceeded},
		}},
		{"cancel ends it with Canceled and the budget's timer stays quiet", []op{
			{do: "run", d: 10 * ms, left: 90 * ms},
			{do: "cancel", err: context.Canceled},
			{do: "run", d: time.Hour, err: context.Canceled},
		}},
		{"the caller's context ends it with the caller's error", []op{
			{do: "run", d: 10 * ms, left: 90 * ms},
			{do: "parent", err: context.Canceled},
			{do: "run", d: time.Hour, err: context.Canceled},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC))
			parent, stopParent := context.WithCancel(t.Context())
			defer stopParent()
			d := newCallDeadline(parent, 100*ms, clk)
			child, stopChild := context.WithCancel(d) // a blocking function's context
			defer stopChild()
			for i, o := range tt.ops {
				switch o.do {
				case "run":
					d.resume()
					clk.Step(o.d)
				case "wait":
					d.pause()
					clk.Step(o.d)
					d.resume()
				case "cancel":
					d.cancel()
				case "parent":
					stopParent()
				}
				if err := d.Err(); !errors.Is(err, o.err) || (err == nil) != (o.err == nil) {
					t.Fatalf("op %d (%s %s): Err = %v, want %v", i, o.do, o.d, err, o.err)
				}
				ended := false
				select {
				case <-d.Done():
					ended = true
				default:
				}
				if ended != (o.err != nil) || (child.Err() != nil) != ended {
					t.Fatalf("op %d (%s %s): done %v, derived context's err %v; want done %v", i, o.do, o.d, ended, child.Err(), o.err != nil)
				}
				if o.err != nil {
					continue
				}
				if left := d.budget - d.own(); left != o.left {
					t.Fatalf("op %d (%s %s): %s of the budget left, want %s", i, o.do, o.d, left, o.left)
				}
				if dl, ok := d.Deadline(); !ok || dl != clk.Now().Add(o.left) {
					t.Fatalf("op %d (%s %s): Deadline %v, %v; want now + %s", i, o.do, o.d, dl, ok, o.left)
				}
			}
		})
	}
}
