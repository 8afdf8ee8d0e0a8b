// Command bare is the reference of the benchmark in ../: the smallest client-go
// controller that does what the benchmark's Lua handlers do, with no framework.
//
// A dynamic informer watches bench.luaop.dev/v1 benchobjects in one namespace; every
// object that needs work goes into a client-go workqueue served by a pool of workers
// (the same number as luaop's --workers), and each worker sends one merge patch of
// /status:
//
//   - status.handled != true              -> {"status":{"handled":true}}      (create storm)
//   - spec.n >= 1 and status.updated != n  -> {"status":{"updated":n}}          (update storm)
//
// (both in one patch when both are due). It is level-based like any controller: an
// object whose cached body needs nothing is "done". It keeps no state of its own.
//
// It prints one line, "synced", on stdout once the informer listed the namespace, and
// nothing else; it serves nothing. It exits on SIGTERM/SIGINT, or, with -expect N,
// once it has seen N objects done (the benchmark measures a restart this way).
//
// # Boundaries
//
// It imports no luaop package, on purpose: it is the reference luaop is measured
// against, client-go alone.
package main
