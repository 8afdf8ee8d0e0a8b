// Package peering lets operators of one --prefix that serve the same resources
// coordinate, as kopf's peering does: the operator with the highest priority works,
// the others pause (take no new work, stop their daemons and timers, keep their
// state) and resume when it is gone. Its main use is `luaop dev` (priority 666) on
// a cluster where the operator also runs deployed (`luaop run`, priority 0): the
// deployed one pauses while the developer's session runs, so no object is handled
// by both.
//
// # The protocol
//
// Every operator keeps a coordination.k8s.io/v1 Lease of its own in one namespace
// (Options.Namespace), named after its prefix and identity, labelled with its
// prefix, renewed every RenewEvery (a third of LeaseDuration by default) and
// deleted when it stops cleanly. Its annotations say what it serves (resources,
// namespaces), its priority, and whether it has paused. Every operator watches the
// Leases of its prefix and decides (Decide, rule.go):
//   - a live peer (renewed within its lease duration, as this operator observed it)
//     that serves some of the same resources in some of the same namespaces
//     conflicts with it;
//   - a conflicting peer of a higher priority: pause ("in favour of" it);
//   - one of the same priority: both pause, with a warning naming the other (kopf:
//     only one operator of the highest priority may run);
//   - otherwise work; but first wait, for at most one lease duration, until every
//     conflicting peer of a lower priority has said (its paused annotation) that its
//     work in flight has ended, so that no object is handled by two operators at
//     once across a handover (kopf does not wait: it has no such signal).
//
// A peer gone without deleting its Lease (killed) stops blocking when its lease
// expires; its Lease is deleted by the others one lease duration later (kopf's
// autoclean). Liveness uses the time this operator saw a renewal, not the peer's
// clock (client-go's leader election does the same), except for a Lease seen for
// the first time, which is judged by its renewTime.
//
// When the Leases cannot be written (the namespace does not exist, RBAC forbids
// it) the operator works alone, says so, and tries again every RenewEvery.
//
// # Who owns what
//
// One goroutine (Peering.Run) owns the decision state and is the only writer of
// the operator's Lease. The Worker's Pause runs on a goroutine of its own (it waits
// for the work in flight, which may take long), so renewals never stop while an
// operator pauses; its end is reported back to the loop, which then publishes
// "paused". Before it resumes the Worker (or pauses it anew) the loop calls off
// that goroutine's Pause and waits for it to return, so the Worker sees its calls
// in the loop's order. State is published through an atomic pointer (State), read by /debug,
// the metrics and the dev view without a lock.
//
// It imports no luaop package and must not: the operator it pauses and resumes is
// the consumer's interface (Worker), wired by cmd/luaop.
package peering
