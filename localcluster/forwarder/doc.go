// Command luaop-forwarder publishes a TCP port of a network namespace on this
// machine's loopback, as docker publishes the API server port of a kind node
// (docker-proxy): it accepts on -listen and copies each connection to -to. The
// kind-like topology of localcluster/up.sh (LUAOP_CLUSTER_TOPOLOGY=netns) runs it
// on the host; down.sh stops it by its pid file.
//
// # Boundaries
//
// The standard library only, so that up.sh starts it without anything else of luaop;
// it holds no state but its connections, each copied by two goroutines of its own.
package main
