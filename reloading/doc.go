// Package reloading is the one owner of the reload, below cmd/: the first load at
// start and every reload after a save, in `luaop run` and `luaop dev` alike.
//
// A [Reloader] reads the scripts folder (scriptwatch's [scriptwatch.Watch]) and,
// with Options.API, the ConfigMap it is mounted from through the API (a second
// source: sources.go decides which change to load, one reload per content, the
// newest by resourceVersion, and whether the folder is that ConfigMap alone), loads
// each settled change into the operator (operator.LoadScripts: the runtime's
// atomic swap, then the reactor's refresh), and does what follows every load: the
// last good scripts kept ([LastGoodStore], a ConfigMap; served when the first load
// fails), the metrics (counts, the failed gauge, the save-to-active latency), the
// webhook configurations and peering's scope resynced, the operator's notes for
// /readyz and /debug, and the view (devloop) or the log. The webhook that refuses a
// scripts ConfigMap whose scripts do not load is scriptsguard's: reloading does not
// import admission, so neither does devloop through it.
//
// It takes each part it tells as a small interface (Operator, Metrics, Follower,
// View, LastGood), so it must not import cmd/, devloop, peering or the operator's
// package; nor call the watcher's internals. cmd/luaop only wires it.
//
// Lock rules: a Reloader holds no lock (its state is owned by the caller of Watch
// and First, then by the one goroutine running Run; never call them concurrently),
// so none is held while it calls out. LastGoodStore.mu
// guards its pending and written sets only and is never held across a call or the
// API server's answer.
package reloading
