// Package leader runs one active instance among several replicas of an operator:
// leader election on a coordination.k8s.io/v1 Lease, with client-go's
// tools/leaderelection.
//
// The pattern is the safe one of Kubernetes controllers: an instance works only
// while it holds the lease, standbys wait, and an instance that loses the lease
// stops working and exits (Run returns ErrLeadershipLost), to be restarted as a
// fresh standby. An instance that is stopped (its context is cancelled) keeps the
// lease renewed until its work has returned, then releases it, so a standby takes
// over at once, and never while the previous leader still runs handlers.
//
// "At once": a standby watches the Lease, and a release it sees calls off its
// waiting and makes it try again right away, instead of at client-go's next retry
// (RetryPeriod plus up to 1.2 times that in jitter: 2 to 4.4 s by default), so that a
// rolling update hands over in the time of one write. A crashed leader releases
// nothing: standbys take over when its lease expires (LeaseDuration).
//
// # Boundaries
//
// It owns one Lease's election and nothing of the operator: lead is the caller's
// function (cmd/luaop runs the operator in it; sharding elects its coordinator with
// it). It imports no luaop package and must not: the operator's packages call it,
// never the reverse. Each Run's state lives in a term, behind a leaf mutex; lead and
// the API server are called with no lock held.
package leader
