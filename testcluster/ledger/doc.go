// Package ledger counts handler runs outside the operator and checks, from the
// objects' own history, the promises of README "Semantics": no change lost, no
// succeeded handler run again on the same change, finalizers released exactly when
// every delete handler succeeded, no write landing on a re-created namesake.
//
// It sees two things, both read from kube-apiserver directly (never through the
// operator, never from its log):
//
//   - every version of every watched object (Observe, fed by Follow: a watch of the
//     test's own), from which it learns, per incarnation (uid), when each handler's
//     success on each change was first stored on the object;
//   - a record per handler run (ObserveRun), which the handlers write themselves
//     through luaop.kube, as the last thing before they return (RunScript is the Lua
//     helper): a ConfigMap naming the handler, the incarnation, the change it handled
//     and the generation of the state it saw.
//
// The handlers stamp what they write with their incarnation and change: they return
// {change, gen, uid} (status.<handler id>), and write the annotation
// ledger.luaop.dev/<handler id> = uid through ctx.patch. The objects carry a
// generation of their own, spec.gen, raised by every change the test makes, and an
// incarnation number, spec.incarnation.
//
// resourceVersions are compared as numbers across resources: on one etcd they are its
// revisions, one sequence for every object (true of the local control plane the tests
// run; kube-apiserver documents them as opaque).
//
// # Boundaries
//
// It judges the operator from the objects alone: it imports state (the stored
// progress and diff-base, as luaop writes them) and nothing of the operator
// (operator, processing, luabind), and must not. Its records sit behind one leaf
// mutex; no API call is made with it held.
package ledger
