package processing

import (
	"context"
	"sync"
	"sync/atomic"
)

// Pausing (kopf's operator pause, which its peering drives): a paused Reactor takes
// no new work (workers hold the key they got and wait; the informers keep the
// objects' newest bodies, so nothing is missed), its daemons are stopped and none is
// started, and no timer runs (timers run in cycles). Everything else is kept: the
// objects' memories, memos, handler progress on the objects. Resume gives every
// known object a cycle, which starts their daemons again and runs the timers due.
// The raw events of a pause are not kept for the event handlers: they are the
// working peer's (kopf stops its watch streams while paused), and replaying them
// at Resume would run those handlers again for what the peer handled (and hold
// every body of a long pause in memory).
//
// Pause returns once the work in flight has ended: the cycles that had started
// finished (their patches written) and the daemons exited. Only then may another
// operator start handling the same objects (the peering package waits for it).
// Known limit: what a daemon handed over since its object's last cycle (daemons'
// patches are written by cycles, and a paused Reactor runs none) is written at
// Resume, after the peer's session, where it may overwrite the peer's daemon's
// newer values until this daemon, restarted, writes again.

// pauseGate lets workers through while the Reactor is not paused and counts the
// cycles in flight. Its lock mu is a leaf.
type pauseGate struct {
	// order makes Pause's taking effect (the gate, then the daemon registry) and
	// Resume one after the other: a Resume between the two would leave the
	// registry paused, starting no daemon, while the Reactor works. Held only
	// around those in-memory steps (never while waiting or logging).
	order  sync.Mutex
	mu     sync.Mutex
	paused bool
	// pausedNow mirrors paused for the watch side, which reads it on every event
	// without the lock (raw events are not kept while paused).
	pausedNow atomic.Bool
	reason    string
	// resumed is closed by Resume (and by shutdown): workers waiting on it go on.
	resumed chan struct{}
	// active counts the cycles in flight; idle is closed when it drops to 0 while
	// paused (made by Pause).
	active int
	idle   chan struct{}
	closed bool
	// waiting counts the workers holding a key until Resume (tests, /debug).
	waiting int
	// quiet: the pause began before Start (the operator starts paused until
	// peering decides): neither it nor its end is logged.
	quiet bool
}

// enter blocks while the Reactor is paused, then counts a cycle in flight; false
// once the gate is shut down (the Reactor is stopping).
func (g *pauseGate) enter() bool {
	for {
		g.mu.Lock()
		if g.closed {
			g.mu.Unlock()
			return false
		}
		if !g.paused {
			g.active++
			g.mu.Unlock()
			return true
		}
		wait := g.resumed
		g.waiting++
		g.mu.Unlock()
		<-wait
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
	}
}

// leave ends a cycle counted by enter.
func (g *pauseGate) leave() {
	g.mu.Lock()
	g.active--
	if g.active == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// shutdown lets every waiting worker go (they find the Reactor stopping).
func (g *pauseGate) shutdown() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.closed = true
	if g.paused {
		close(g.resumed)
		g.paused = false
		g.pausedNow.Store(false)
	}
}

// Pause stops the Reactor taking new work, stops its daemons (each within its
// cancellation timeout) and starts none, and returns once the cycles in flight have
// ended and the daemons have exited, or with ctx's error if ctx ends first (the
// Reactor stays paused), or nil at once if Resume is called meanwhile. reason is
// what /debug shows. Pause may be called before Start: the Reactor then starts
// paused. Calling it again while paused only updates the reason.
func (o *Reactor) Pause(ctx context.Context, reason string) error {
	g := &o.pause
	g.order.Lock()
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		g.order.Unlock()
		return nil
	}
	began := !g.paused
	if began {
		g.paused = true
		g.pausedNow.Store(true)
		g.resumed = make(chan struct{})
		o.startMu.Lock()
		g.quiet = o.ctx == nil
		o.startMu.Unlock()
	}
	quiet := g.quiet
	g.reason = reason
	resumed := g.resumed
	var idle chan struct{}
	if g.active > 0 {
		if g.idle == nil {
			g.idle = make(chan struct{})
		}
		idle = g.idle
	}
	g.mu.Unlock()

	// From here on no daemon starts (an in-flight cycle's adjustDaemons finds the
	// registry paused); those running are asked to stop.
	running := o.daemons.pause()
	g.order.Unlock()
	if began && !quiet {
		o.log.Info("pausing: no new work, daemons stopped", "reason", reason)
	}
	if idle != nil {
		select {
		case <-idle:
		case <-resumed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, d := range running {
		select {
		case <-d.done:
		case <-resumed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Resume lets the Reactor take work again and gives every known object a cycle
// (their daemons start again, their timers run). A no-op when not paused.
func (o *Reactor) Resume() {
	g := &o.pause
	g.order.Lock()
	g.mu.Lock()
	if !g.paused || g.closed {
		g.mu.Unlock()
		g.order.Unlock()
		return
	}
	g.paused, g.reason = false, ""
	g.pausedNow.Store(false)
	close(g.resumed)
	quiet := g.quiet
	g.mu.Unlock()
	o.daemons.resume()
	g.order.Unlock()
	if !quiet {
		o.log.Info("resuming: taking work again")
	}
	// The queue exists once Start set ctx (under startMu, after making it).
	o.startMu.Lock()
	started := o.ctx != nil
	o.startMu.Unlock()
	if !started {
		return
	}
	for _, key := range o.objects.keys() {
		o.queue.Add(key)
	}
}

// Paused tells whether the Reactor is paused, and why.
func (o *Reactor) Paused() (bool, string) {
	g := &o.pause
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused, g.reason
}

// pause marks the registry paused (no daemon starts) and asks every running daemon
// to stop, with its cancellation backoff and timeout; it returns those daemons.
func (r *daemonRegistry) pause() []*daemonRun {
	r.mu.Lock()
	r.paused = true
	all := make([]*daemonRun, 0, len(r.running))
	for d := range r.running {
		all = append(all, d)
	}
	r.mu.Unlock()
	for _, d := range all {
		d.stop(d.spec.CancellationBackoff, cancellationTimeout(*d.spec))
	}
	return all
}

func (r *daemonRegistry) resume() {
	r.mu.Lock()
	r.paused = false
	r.mu.Unlock()
}
