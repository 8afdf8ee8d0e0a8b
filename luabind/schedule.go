package luabind

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Scheduling a shard's Lua state (see doc.go, "Scheduling").
//
// One call runs Lua on a state at a time. Calls that want the state while another
// holds it wait in line, and the state is handed from one call to the next in the
// order they asked (stateLock): a call starting, one coming back from a blocking
// function, one that was preempted. A call that holds the state while another waits
// is asked to give it up (preempted) once it held it for its slice, at its next
// instruction (the patched gopher-lua's Preempt hook); it then waits in line like
// any other. So a runaway call (an endless loop, a long computation) delays each
// call of its state by one slice at most, not by its deadline.
//
// A turn is never shorter than minTurnInstructions VM instructions: what a script
// sees, that its Lua runs without another call in between, then holds for every
// stretch of fewer instructions, however loaded the machine.
//
// A call's handler deadline (callDeadline) counts the call's own time: while it
// runs Lua and while it waits in its own blocking functions, not while it waits for
// its state. Waiting for the state can then never make a call time out.

const (
	// firstSlice is how long a call may hold its state, while another call waits,
	// before it is preempted: ordinary handlers' stretches of Lua between two
	// blocking functions are far shorter (about 60 us), so they never are.
	firstSlice = 10 * time.Millisecond
	// laterSlice is a preempted call's slice for the rest of its call: a call shown to
	// run long holds the state at most that long at a time while others wait, and
	// still gets that much of each turn, however many calls wait.
	laterSlice = time.Millisecond
	// minTurnInstructions is how many VM instructions a call runs in a turn before
	// it may be preempted, however long the turn took. A slice is wall-clock time,
	// which a loaded machine stretches by descheduling the goroutine: without this
	// floor, a handler's few instructions between two blocking functions (say
	// `done = done + 1`) could be cut in two by another call of its state, which
	// scripts may rely on never happening. An endless loop's turn is then about
	// 1 ms (BenchmarkInnocentCallNextToRunaway: an innocent call, which takes the
	// state twice, waits 2.3 ms at the median).
	minTurnInstructions = 100_000
)

// stateLock is the lock of one Lua state, handed over in the order it was asked
// for. mu guards the fields below it; neither request nor a clock callback is
// called with mu held by them (the timer callback takes no lock at all).
type stateLock struct {
	clock clock.WithDelayedExecution
	// request asks the holder to give the state back at its next instruction: a
	// hint, which the holder checks with yieldDue (a request may be stale).
	request func()

	mu   sync.Mutex
	held bool
	// since is when the holder took the state, slice how long it may hold it while
	// others wait; armed is set once a timer asks it at since+slice.
	since time.Time
	slice time.Duration
	armed bool
	// holds counts the holds, so that a timer armed for one does not ask the next
	// (it is read by the timer callback without mu).
	holds atomic.Uint64
	queue []*stateWaiter
}

// stateWaiter is one call waiting in line for the state.
type stateWaiter struct {
	// granted is closed when the state is handed to this waiter, which then holds it.
	granted chan struct{}
	slice   time.Duration
}

func newStateLock(clk clock.WithDelayedExecution, request func()) *stateLock {
	return &stateLock{clock: clk, request: request}
}

// join takes the state if it is free (nil), else puts the caller in line and
// returns its place: the state is its own once granted is closed.
func (l *stateLock) join(slice time.Duration) *stateWaiter {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.held {
		l.held = true
		l.takeLocked(slice)
		return nil
	}
	w := &stateWaiter{granted: make(chan struct{}), slice: slice}
	l.queue = append(l.queue, w)
	l.askHolderLocked()
	return w
}

// tryJoin takes the state if nobody holds it, without waiting in line; it tells
// whether it did (the memory report measures a state only when it is free).
func (l *stateLock) tryJoin(slice time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held {
		return false
	}
	l.held = true
	l.takeLocked(slice)
	return true
}

// leave takes w out of the line, when its caller gives up waiting. It tells
// whether w had been granted the state meanwhile: then the caller holds it and
// must release it.
func (l *stateLock) leave(w *stateWaiter) (granted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, q := range l.queue {
		if q == w {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			return false
		}
	}
	return true
}

// release gives the state to the first call in line, or frees it.
func (l *stateLock) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 {
		l.held = false
		l.holds.Add(1)
		return
	}
	w := l.queue[0]
	l.queue[0] = nil
	l.queue = l.queue[1:]
	l.takeLocked(w.slice)
	close(w.granted)
	if len(l.queue) > 0 {
		l.askHolderLocked()
	}
}

// takeLocked starts a hold of the state. mu held.
func (l *stateLock) takeLocked(slice time.Duration) {
	l.holds.Add(1)
	l.since, l.slice, l.armed = l.clock.Now(), slice, false
}

// askHolderLocked asks the holder to give the state back, now if it held it for
// its slice already, else when it will have (a timer, once per hold). mu held.
func (l *stateLock) askHolderLocked() {
	left := l.slice - l.clock.Since(l.since)
	if left <= 0 {
		l.request()
		return
	}
	if l.armed {
		return
	}
	l.armed = true
	hold := l.holds.Load()
	l.clock.AfterFunc(left, func() {
		if l.holds.Load() == hold {
			l.request()
		}
	})
}

// yieldDue tells the holder whether it should give the state back now: another
// call waits and it held the state for its slice.
func (l *stateLock) yieldDue() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue) > 0 && l.clock.Since(l.since) >= l.slice
}

// waiting is the number of calls in line.
func (l *stateLock) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}

// callDeadline is a call's handler deadline: a context that ends when the call has
// spent its budget of its own time. The time it spends waiting for its Lua state
// is not counted: the caller pauses the deadline around each such wait (pause,
// resume). It is the context of the call's thread, which the VM checks between
// instructions, and of its blocking functions.
//
// Done and Value are those of a context derived from the caller's (inner), so that
// the caller's end ends it too and contexts derived from it attach to inner as to
// any cancellable context (no goroutine each). Err is context.DeadlineExceeded
// once the budget is spent, as for a context.WithTimeout.
type callDeadline struct {
	inner  context.Context
	end    context.CancelFunc
	done   <-chan struct{}
	clock  clock.WithDelayedExecution
	budget time.Duration
	// err is set once, before inner is cancelled: DeadlineExceeded (the budget is
	// spent) or Canceled (cancel); nil when the caller's context ended it.
	err atomic.Pointer[error]

	mu sync.Mutex
	// used is the own time spent before the current run; running is set between
	// resume and pause, from since; timer ends the context when the budget is spent.
	used    time.Duration
	since   time.Time
	running bool
	timer   clock.Timer
}

// newCallDeadline starts a deadline of budget under parent, running.
func newCallDeadline(parent context.Context, budget time.Duration, clk clock.WithDelayedExecution) *callDeadline {
	inner, end := context.WithCancel(parent)
	d := &callDeadline{inner: inner, end: end, done: inner.Done(), clock: clk, budget: budget}
	d.resume()
	return d
}

func (d *callDeadline) Done() <-chan struct{} { return d.done }
func (d *callDeadline) Value(key any) any     { return d.inner.Value(key) }

func (d *callDeadline) Err() error {
	if err := d.err.Load(); err != nil {
		return *err
	}
	return d.inner.Err()
}

// Deadline is when the budget will be spent if the call keeps running from now on.
func (d *callDeadline) Deadline() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running {
		return d.since.Add(d.budget - d.used), true
	}
	return d.clock.Now().Add(d.budget - d.used), true
}

// pause stops counting: the call waits for its state.
func (d *callDeadline) pause() {
	d.mu.Lock()
	if !d.running {
		d.mu.Unlock()
		return
	}
	d.used += d.clock.Since(d.since)
	d.running = false
	t := d.timer
	d.timer = nil
	d.mu.Unlock()
	// A timer that fires meanwhile found the budget spent while the call ran: right.
	t.Stop()
}

// resume counts again: the call has its state back.
func (d *callDeadline) resume() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running || d.err.Load() != nil {
		return
	}
	left := d.budget - d.used
	if left <= 0 {
		d.finish(context.DeadlineExceeded)
		return
	}
	d.running, d.since = true, d.clock.Now()
	d.timer = d.clock.AfterFunc(left, func() { d.finish(context.DeadlineExceeded) })
}

// own is the own time spent so far.
func (d *callDeadline) own() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running {
		return d.used + d.clock.Since(d.since)
	}
	return d.used
}

// cancel ends the context with context.Canceled (the call ended, or the memory
// budget's watchdog stops it). A context.CancelFunc.
func (d *callDeadline) cancel() {
	d.finish(context.Canceled)
	d.mu.Lock()
	t := d.timer
	d.timer, d.running = nil, false
	d.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

// finish ends the context with err, unless it ended already. Takes no lock of d's:
// the timer's callback calls it (a fake clock calls it under its own lock).
func (d *callDeadline) finish(err error) {
	if d.inner.Err() != nil || !d.err.CompareAndSwap(nil, &err) {
		return
	}
	d.end()
}
