// Package metrics exposes luaop's Prometheus metrics under the names that existing
// dashboards know: controller-runtime's reconcile metrics (one cycle of one object
// is one reconcile; a resource is a controller), client-go's work queue metrics
// per resource, its REST client and leader election metrics, and luaop's own:
// handler runs, Lua errors, daemons and timers, script reloads, build info. The Go
// runtime and process collectors are included. README.md lists every metric.
//
// Every Metrics has a registry of its own: nothing is registered with the global
// default registry, and two operators in one process (tests) do not collide, with
// one exception: client-go reports REST requests and leader election through
// process-wide hooks, so rest_client_requests_total and
// leader_election_master_status count for the whole process, and every registry
// shows them.
// All methods are safe for concurrent use.
//
// # Boundaries
//
// It owns the registry and the collectors; the operator's packages report to it
// through interfaces of theirs that Metrics satisfies (processing.ReconcileObserver,
// admission.RequestObserver, sharding.Observer, the workqueue MetricsProvider), so
// it imports no luaop package and must not. The engine collector's mutex is a leaf;
// the counts function it holds is called, at scrape time, with no lock held.
package metrics
