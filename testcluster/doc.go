// Package testcluster connects integration and end-to-end tests to a real
// kube-apiserver (the local control plane of localcluster/, or any cluster named by
// LUAOP_TEST_KUBECONFIG), installs CRDs, gives each test its own namespace, and runs
// operators in-process, exactly as `luaop run` assembles them.
//
// It never falls back to the user's KUBECONFIG: tests create and delete objects, and
// must not do so in a cluster that was not made for them.
//
// # Boundaries
//
// Tests and the soak (bench/soak) use it, never the product: no package outside
// tests and bench/ may import it. It assembles operators only through package
// operator, as `luaop run` does, and must not reach into processing or luabind. Its
// fault proxy (proxy.go) keeps its state behind one mutex, not held while a request
// is forwarded.
package testcluster
