// Package sharding lets several replicas of one operator share its objects, each
// watching and handling only its own: scale-out, where leader election (package
// leader) gives one active replica and standbys.
//
// # Members and assignment
//
// Every replica holds a coordination.k8s.io/v1 Lease of its own,
// <group>-member-<member>, labelled luaop.dev/shard-group=<group>: its membership,
// renewed every RenewEvery (another attempt beside one unanswered for a quarter of
// RenewDeadline, a refused one retried); a replica that cannot renew for
// RenewDeadline stops handling at once (StopWritingAtOnce: the Reactor cancels its
// cycles and daemons with no grace; Run returns ErrMembershipLost) before the others
// may take its objects (once its Lease's
// leaseDurationSeconds, RenewDeadline and a margin, has passed since they saw its
// last renewal; what LeaseDuration leaves is for the move). One replica, elected
// on the Lease <group>-coordinator with the leader package (no extra component),
// is the coordinator: it watches the metadata of every object of the sharded
// resources and writes each object's member into the label <prefix>/shard. Of
// each object it keeps a record of 40 bytes (its version, shard label, handover
// annotation, deletion, finalizer count and planned member; member names
// interned), about 180 bytes an object with its map and a pass's items, so
// the coordinator's live heap is little more than the others' (its lists'
// garbage aside: BENCHMARKS.md).
// Objects are placed by consistent hashing with virtual nodes and bounded loads
// (Ring, Plan): balanced within DefaultTolerance whatever the members' names, and
// a member coming or going moves only the objects it takes or gives. Each
// replica's Reactor watches with the label selector <prefix>/shard=<member>
// (processing.Shard), so memory and watch load split, not only work. A resource
// whose objects luaop may not patch cannot be labelled: every replica watches all
// of it and keeps what the ring gives it (Admits), said in the log.
//
// # Handover
//
// To move an object from a live member, the coordinator sets the annotation
// <prefix>/shard-handover=<new member>, and nothing else. The owner's watch
// delivers it; from that notification on, the owner refuses the object's
// notifications, lets the cycle in flight finish, stops its daemons and timers
// and forgets it (processing.Reactor.Release), and only then moves the label to
// the new member and removes the annotation, in one JSON patch that tests the
// annotation. The new member's watch sees the object only after that write:
// never two handlers at once, and no gap but the handover itself. Progress and
// the diff-base live on the object, so the new member resumes where the old one
// stopped; memos are in memory and start empty. A member that is gone (Lease
// deleted by a clean stop, or expired) releases nothing: the coordinator writes
// the label of its objects directly.
//
// # Who owns what
//
// The membership (membership.go) owns the observed Leases behind a leaf mutex.
// Sharding's leaf mutex guards the resources, the objects this replica owns and
// those it is handing over; Admits (an informer goroutine) and the handover
// workers (a client-go work queue) are its only writers. The coordinator
// (coordinator.go) owns a client-go Reflector per resource and namespace and
// the store it feeds (objects.go: the records, the plan in them, behind the
// store's leaf mutex); one goroutine plans, its workers write, each deciding on
// a copy of the record taken under that mutex. No lock is held while calling
// the API or the Reactor.
//
// It imports leader (the coordinator's election) and state, and must not import
// processing or operator: the Reactor it releases objects from, the elector and the
// metrics are interfaces of its own (Releaser, Elector, Observer), wired by
// cmd/luaop.
package sharding
