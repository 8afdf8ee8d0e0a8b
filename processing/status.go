package processing

import (
	"sort"
	"sync"
	"time"

	"github.com/luaop/luaop/state"
)

// Snapshot is what the operator is doing at one moment (for /debug and `luaop
// status`): objects in flight with their handlers' progress, running daemons and
// scheduled timers. It is a copy: nothing in it changes afterwards.
type Snapshot struct {
	// Objects are the objects a worker is processing now, and those whose cause has
	// handlers still to finish (retrying, or waiting for their turn).
	Objects []ObjectStatus `json:"objects"`
	Daemons []DaemonStatus `json:"daemons"`
	Timers  []TimerStatus  `json:"timers"`
	// Paused is why the Reactor is paused (Reactor.Pause), empty while it works.
	Paused string `json:"paused,omitempty"`
}

// ObjectStatus is one object in flight.
type ObjectStatus struct {
	Resource  string `json:"resource"` // ControllerName: "widgets.example.com"
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
	// ProcessingSince is when the cycle a worker runs now started; nil when no
	// worker holds the object.
	ProcessingSince *time.Time `json:"processingSince,omitempty"`
	// Reason is the cause whose handlers are not all finished (create, update,
	// delete, resume), with their progress as stored on the object.
	Reason   string            `json:"reason,omitempty"`
	Handlers []HandlerProgress `json:"handlers,omitempty"`
}

// HandlerProgress is one handler's progress in a cause.
type HandlerProgress struct {
	ID string `json:"id"`
	// State is "succeeded", "failed", "waiting" (to run after Delayed: a retry or
	// a temporary error's delay) or "pending" (runs at its turn).
	State   string     `json:"state"`
	Retries int        `json:"retries,omitempty"`
	Started *time.Time `json:"started,omitempty"`
	Delayed *time.Time `json:"delayed,omitempty"`
	Message string     `json:"message,omitempty"`
}

// DaemonStatus is one running daemon.
type DaemonStatus struct {
	Resource  string    `json:"resource"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	Handler   string    `json:"handler"`
	Since     time.Time `json:"since"`
	// Stopping: asked to stop (object deleted, filter no longer matching, code
	// changed), not exited yet.
	Stopping bool `json:"stopping,omitempty"`
}

// TimerStatus is one timer of one object.
type TimerStatus struct {
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Handler   string `json:"handler"`
	// Next is when it runs next; nil for an idle timer waiting for a change.
	Next    *time.Time `json:"next,omitempty"`
	Retries int        `json:"retries,omitempty"`
}

// Snapshot takes a copy of what the operator does now. Every part is published by
// its owner (the worker holding an object's key, the daemon registry) under a leaf
// lock, and copied here under that lock: it never waits for a cycle.
func (o *Reactor) Snapshot() Snapshot {
	s := o.board.snapshot()
	s.Daemons = o.daemons.snapshot()
	if paused, reason := o.Paused(); paused {
		s.Paused = reason
		if s.Paused == "" {
			s.Paused = "paused"
		}
	}
	return s
}

// statusBoard is where workers publish, at the end of each step, what Snapshot
// shows of their object: the worker owns the object's memory without a lock, so it
// copies the little /debug needs here. mu is a leaf.
type statusBoard struct {
	mu      sync.Mutex
	objects map[objectKey]*boardEntry
}

type boardEntry struct {
	kind, uid       string
	processingSince time.Time
	reason          string
	handlers        []HandlerProgress
	timers          []TimerStatus
}

func (b *statusBoard) entry(key objectKey) *boardEntry {
	if b.objects == nil {
		b.objects = map[objectKey]*boardEntry{}
	}
	e := b.objects[key]
	if e == nil {
		e = &boardEntry{}
		b.objects[key] = e
	}
	return e
}

func (b *statusBoard) dropIfIdle(key objectKey, e *boardEntry) {
	if e.processingSince.IsZero() && e.handlers == nil && e.timers == nil {
		delete(b.objects, key)
	}
}

// begin: a worker took the object.
func (b *statusBoard) begin(key objectKey, now time.Time) {
	b.mu.Lock()
	b.entry(key).processingSince = now
	b.mu.Unlock()
}

// end: the worker is done with the object.
func (b *statusBoard) end(key objectKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.objects[key]; e != nil {
		e.processingSince = time.Time{}
		b.dropIfIdle(key, e)
	}
}

// progress publishes the handlers of an unfinished cause; a finished one clears.
func (b *statusBoard) progress(key objectKey, kind, uid, reason string, states []handlerState, now time.Time) {
	var handlers []HandlerProgress
	if reason != "" {
		handlers = make([]HandlerProgress, 0, len(states))
		for _, h := range states {
			handlers = append(handlers, handlerProgress(h.spec.ID, h.record, now))
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key)
	e.kind, e.uid, e.reason, e.handlers = kind, uid, reason, handlers
	b.dropIfIdle(key, e)
}

func handlerProgress(id string, r state.HandlerRecord, now time.Time) HandlerProgress {
	p := HandlerProgress{ID: id, Retries: r.Retries, Started: r.Started, Message: r.Message}
	switch {
	case r.Success:
		p.State = "succeeded"
	case r.Failure:
		p.State = "failed"
	case r.Sleeping(now):
		p.State, p.Delayed = "waiting", r.Delayed
	default:
		p.State = "pending"
	}
	return p
}

// setTimers publishes an object's timers (from the worker's memory).
func (b *statusBoard) setTimers(key objectKey, timers map[string]*timerState) {
	var list []TimerStatus
	for id, ts := range timers {
		t := TimerStatus{Resource: ControllerName(key.resource), Namespace: key.namespace, Name: key.name, Handler: id, Retries: ts.retries}
		if !ts.waitChange {
			next := ts.next
			t.Next = &next
		}
		list = append(list, t)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if list == nil && b.objects[key] == nil {
		return
	}
	e := b.entry(key)
	e.timers = list
	b.dropIfIdle(key, e)
}

// forget drops what is known of an incarnation that is over (its cycle, if one
// runs, stays shown).
func (b *statusBoard) forget(key objectKey) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.objects[key]; e != nil {
		e.reason, e.handlers, e.timers = "", nil, nil
		b.dropIfIdle(key, e)
	}
}

func (b *statusBoard) snapshot() Snapshot {
	s := Snapshot{Objects: []ObjectStatus{}, Timers: []TimerStatus{}}
	b.mu.Lock()
	for key, e := range b.objects {
		s.Timers = append(s.Timers, e.timers...)
		if e.processingSince.IsZero() && e.handlers == nil {
			continue
		}
		os := ObjectStatus{Resource: ControllerName(key.resource), Kind: e.kind, Namespace: key.namespace, Name: key.name,
			UID: e.uid, Reason: e.reason, Handlers: append([]HandlerProgress(nil), e.handlers...)}
		if !e.processingSince.IsZero() {
			since := e.processingSince
			os.ProcessingSince = &since
		}
		s.Objects = append(s.Objects, os)
	}
	b.mu.Unlock()
	sort.Slice(s.Objects, func(i, j int) bool {
		a, b := s.Objects[i], s.Objects[j]
		return a.Resource+"\x00"+a.Namespace+"\x00"+a.Name < b.Resource+"\x00"+b.Namespace+"\x00"+b.Name
	})
	sort.Slice(s.Timers, func(i, j int) bool {
		a, b := s.Timers[i], s.Timers[j]
		return a.Resource+"\x00"+a.Namespace+"\x00"+a.Name+"\x00"+a.Handler < b.Resource+"\x00"+b.Namespace+"\x00"+b.Name+"\x00"+b.Handler
	})
	return s
}

// snapshot lists the running daemons.
func (r *daemonRegistry) snapshot() []DaemonStatus {
	r.mu.Lock()
	out := make([]DaemonStatus, 0, len(r.running))
	for d := range r.running {
		out = append(out, DaemonStatus{Resource: ControllerName(d.key.resource), Namespace: d.key.namespace, Name: d.key.name,
			Handler: d.spec.ID, Since: d.startedAt, Stopping: d.stopping()})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return a.Resource+"\x00"+a.Namespace+"\x00"+a.Name+"\x00"+a.Handler < b.Resource+"\x00"+b.Namespace+"\x00"+b.Name+"\x00"+b.Handler
	})
	return out
}

// EngineCounts counts the running daemons and the scheduled timers per resource
// (ControllerName), for metrics; cheaper than a Snapshot.
func (o *Reactor) EngineCounts() (daemons, timers map[string]int) {
	daemons, timers = map[string]int{}, map[string]int{}
	o.daemons.mu.Lock()
	for d := range o.daemons.running {
		daemons[ControllerName(d.key.resource)]++
	}
	o.daemons.mu.Unlock()
	o.board.mu.Lock()
	for key, e := range o.board.objects {
		if n := len(e.timers); n > 0 {
			timers[ControllerName(key.resource)] += n
		}
	}
	o.board.mu.Unlock()
	return daemons, timers
}
