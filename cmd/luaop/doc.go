// Command luaop runs Kubernetes operators whose handlers are Lua scripts.
//
//	luaop dev ./handlers     the developer loop against the current cluster
//	luaop run /scripts       production: JSON logs, health endpoint
//
// and test, check, init, rbac, release, status, stubs, webhooks and version.
//
// It owns the wiring, and the commands that are only a few calls on the API: the settings (flags, LUAOP_* variables and the config
// file, settings.go), the process's parts made and connected (runOperator: the
// operator, the admission webhooks, leader election, peering, sharding, the
// health and metrics endpoints, the reload), the exit codes and the commands' own
// output. The reload is package reloading's (the first load, every reload, the last
// good scripts, the scripts guard); the live view is devloop's; handling objects is
// the operator's. cmd/luaop must not re-implement them: what it passes on is the
// adapters those packages ask for (devView, peerScope). Besides the wiring it holds
// the commands' own rules: the RBAC generator (rbac.go, from scriptapi's table),
// the readiness rules of /readyz, the cluster guard of `luaop dev`
// (clusterguard.go), `luaop release` and `luaop webhooks remove`.
//
// No package imports it; it holds no state of its own beyond one command's run.
package main
