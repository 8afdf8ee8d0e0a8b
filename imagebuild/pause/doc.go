// Command pause is the pod sandbox of the local node (localcluster/node-up.sh): the
// first process of every pod, holding its namespaces. Like Kubernetes' pause image it
// waits for SIGTERM or SIGINT and, being PID 1 of pods that share their process
// namespace, reaps the children it adopts. Static, built by cmd/luaop-image pause.
//
// # Boundaries
//
// The standard library only: it runs as PID 1 of every pod of the local node, and
// must stay small and static, importing nothing of luaop.
package main
