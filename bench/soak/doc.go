// Command soak runs the luaop binary for a while under steady churn on a local control
// plane and checks that nothing got stuck, leaked or went unready.
//
//	make soak                          # 10 minutes, on its own local control plane
//	make soak SOAK_DURATION=2m
//	LUAOP_TEST_KUBECONFIG=... go run ./bench/soak -duration 2m
//
// The scripts (written by the soak into a folder luaop watches): a daemon per object
// that reads ctx.spec in a loop with luaop.sleep and writes ctx.patch.status now and
// then; a timer per object every 120 s (status.ticked); a create handler, an update
// handler, a field handler on spec.size (its result, status.sized.size, is the last
// size handled: the stuck-object check); a probe.
//
// It creates 500 objects, waits until all are handled, then for -duration: every
// second spec.size changes on a few objects and a few are deleted and re-created under
// the same name; every 30 s the update handler's file is rewritten (a changed comment
// and log line: one handler's code hash changes), which luaop reloads. Throughout it
// polls /readyz (every 250 ms) and /metrics and the process's RSS (every 5 s). After
// the churn and a settle period it checks: every live object handled at its current
// spec.size, no object stuck in deletion, one running daemon per live object (from
// luaop's JSON log: the framework's "daemon started/exited/stopped" lines per object,
// and the daemon's own up/down lines per uid; luaop has no daemon gauge), /readyz 200
// throughout after the first ready, every reload applied without error, luaop still
// running. It prints a summary table (RSS over time included) and exits 1 when a check
// fails, naming the failing objects.
//
// It only talks to 127.0.0.1 (the API server of the kubeconfig must be on loopback),
// and every loop is bounded in time.
//
// # Boundaries
//
// A command of make soak and make chaos; nothing imports it. It runs the luaop
// binary as a child process and judges it from outside only: the API server, its
// /readyz and /metrics, its log, /proc. testcluster gives it the fault proxy and
// RestartComponent, testcluster/ledger the handler runs counted on the objects; it
// must not import the operator's packages (operator, processing, luabind): the
// soak sees what an SRE sees.
package main
