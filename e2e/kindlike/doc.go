// Package kindlike runs `luaop dev` as an SRE runs it on kind: against a control
// plane laid out the way kind lays one out (localcluster/up.sh with
// LUAOP_CLUSTER_TOPOLOGY=netns: the API server in a network namespace of its own,
// published on this machine's loopback by a forwarder, reaching this machine only
// through its veth gateway; a Node with its InternalIP). The cluster is this
// package's own, started and stopped here.
//
// It needs root (network namespaces): where one cannot be made, every test skips
// saying why, except with CI=true, where that is a failure (CI runs as root on
// this machine class).
//
// The package has no code outside its tests. It runs the luaop binary as a child
// process and imports only testcluster (the cluster's clients), never the
// operator's packages: what it asserts is what `luaop dev` shows and the cluster
// holds.
package kindlike
