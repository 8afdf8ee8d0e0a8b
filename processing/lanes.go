package processing

import "sync"

// laneFIFO is the work queue's storage (client-go's workqueue.Queue): two FIFO
// lanes, the front one served first. Only a sharded Reactor puts keys in front
// (frontMarks); without marks it is client-go's default FIFO. With metrics it tells
// queueMetrics what enters and leaves it. client-go calls it under its queue's lock;
// client-go's dirty set makes sure it is never pushed a key it already holds, and
// calls Touch for a key added again while queued.
//
// Why a front lane: in sharded mode, an object new to this Reactor after its
// initial listing came from another replica (a handover, or the coordinator
// relabelled a dead member's objects) or was just created and assigned here. A
// dead member's object has had no owner since the member's Lease lapsed: its
// latency is already the lease, and this replica's own backlog (its own objects'
// changes, often as many as the moved ones when every object changed at once) must
// not add to it. controller-runtime's priority queue ranks the same way: the
// initial list's items below live events. Within each lane the order stays FIFO.
type laneFIFO struct {
	// m is nil without Options.QueueMetrics.
	m *queueMetrics
	// marks are the keys to put in front when pushed or touched next; nil when
	// the Reactor is not sharded (nothing is ever put in front).
	marks *frontMarks

	front, back []objectKey
	// inFront are the keys queued in the front lane.
	inFront map[objectKey]struct{}
	// staleBack counts, per key, its entries in the back lane left behind when it
	// was moved to the front (Touch): Pop skips that many of the key's back
	// entries, always its earliest there (a key is queued once at most, so every
	// back entry but a newer push of the key is stale). stale is their sum.
	staleBack map[objectKey]int
	stale     int
}

func newLaneFIFO(m *queueMetrics, marks *frontMarks) *laneFIFO {
	return &laneFIFO{m: m, marks: marks, inFront: map[objectKey]struct{}{}, staleBack: map[objectKey]int{}}
}

// Touch: key, already queued, was added again. Marked for the front, it moves
// there from the back lane (not duplicated: its back entry turns stale).
func (f *laneFIFO) Touch(key objectKey) {
	if f.marks == nil || !f.marks.take(key) {
		return
	}
	if _, ok := f.inFront[key]; ok {
		return
	}
	f.staleBack[key]++
	f.stale++
	f.front = append(f.front, key)
	f.inFront[key] = struct{}{}
}

func (f *laneFIFO) Push(key objectKey) {
	if f.marks != nil && f.marks.take(key) {
		f.front = append(f.front, key)
		f.inFront[key] = struct{}{}
	} else {
		f.back = append(f.back, key)
	}
	if f.m != nil {
		f.m.pushed(key)
	}
}

func (f *laneFIFO) Len() int { return len(f.front) + len(f.back) - f.stale }

// Pop takes the front lane's first key, else the back lane's first that is not
// stale. client-go calls it only when Len is above zero.
func (f *laneFIFO) Pop() objectKey {
	var key objectKey
	if len(f.front) > 0 {
		key = f.front[0]
		f.front[0] = objectKey{}
		f.front = f.front[1:]
		delete(f.inFront, key)
	} else {
		for {
			key = f.back[0]
			f.back[0] = objectKey{}
			f.back = f.back[1:]
			n := f.staleBack[key]
			if n == 0 {
				break
			}
			if n == 1 {
				delete(f.staleBack, key)
			} else {
				f.staleBack[key] = n - 1
			}
			f.stale--
		}
	}
	if f.m != nil {
		f.m.popped(key)
	}
	return key
}

// frontMarks are the keys the watch side wants in the front lane: marked before
// the key is added to the queue, taken by laneFIFO when client-go pushes or
// touches the key under its queue's lock. mu is a leaf: the watch side holds it
// only to mark, never around the queue's Add, so the order is always the queue's
// lock, then this one.
type frontMarks struct {
	mu   sync.Mutex
	keys map[objectKey]struct{}
}

func newFrontMarks() *frontMarks { return &frontMarks{keys: map[objectKey]struct{}{}} }

func (m *frontMarks) mark(key objectKey) {
	m.mu.Lock()
	m.keys[key] = struct{}{}
	m.mu.Unlock()
}

// take reports whether key was marked, and unmarks it.
func (m *frontMarks) take(key objectKey) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.keys[key]; !ok {
		return false
	}
	delete(m.keys, key)
	return true
}
