// Package e2e runs luaop against a real kube-apiserver: every test starts an
// operator in-process on its own namespace and checks what a user would see with
// kubectl.
//
// The package has no code outside its tests. Operators run in-process through
// testcluster (which assembles them as `luaop run` does); what the tests assert is
// read from the API server (the objects, their Events and Leases), the operator's
// log and /metrics, and testcluster/ledger's count of handler runs: the tests must
// not read the operator's internal state to decide whether it worked.
package e2e
