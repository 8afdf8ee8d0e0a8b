// Command bench measures luaop side by side with a bare client-go controller
// (bench/bare) on the same cluster, in one run, and prints a table.
//
//	make bench                                   # starts and stops a local control plane
//	make bench BENCH_FLAGS='-n 200'              # a quick run
//	LUAOP_TEST_KUBECONFIG=... go run ./bench -n 1000,10000
//
// Implementations: bare (the reference, bench/bare), luaop (the binary, default
// settings), luaop-status (--progress-storage=status --diffbase-storage=status) and
// luaop-daemon (plus a sleeping daemon per object). For every N, each runs on a fresh
// namespace, one after the other (-repeat times, alternating the order), through:
//
//  1. create storm: N objects created by a few concurrent clients while the operator
//     runs; until every object shows status.handled = true.
//  2. update storm: spec.n set to 1 on every object; until status.updated = 1.
//  3. memory: the operator's RSS idle holding N objects, against its RSS idle on the
//     empty namespace before the storms.
//  4. resume: the operator is stopped (SIGTERM) and started again on the N handled
//     objects: time to /readyz 200 (luaop) or to exit with all seen done (reference),
//     and how many handlers ran again (expected: none).
//  5. drain: N objects created on a fresh namespace with no operator running, then
//     the operator started: time until every object is handled.
//
// See BENCHMARKS.md for the method, the figures and their analysis.
//
// # Boundaries
//
// A command run by make bench; nothing imports it. The luaop binary and bench/bare
// are child processes, measured from outside (the API server, /metrics, /proc); the
// in-process subject (subjects.go) assembles an operator from its public packages
// (operator, processing, luabind, metrics) as cmd/luaop does. It must not reach into
// their internals or change what they do: it measures them as users run them.
package main
