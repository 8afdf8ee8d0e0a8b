// Package fakeapi is the in-memory API server that `luaop test` answers handlers'
// luaop.kube calls with, so that what passes offline is what the cluster accepts.
//
// It owns:
//   - the kinds it serves (kinds.go): the built-in kinds of client-go's scheme
//     (typed decoding: a field of the wrong type is refused, an unknown one dropped,
//     as the API server's decoder does; which have a status subresource, which are
//     cluster-scoped), custom resources from CustomResourceDefinition files (their
//     structural schema, subresources, scope), and kinds it knows nothing of, stored
//     as given;
//   - the write path (server.go), done with the API server's own code where it is a
//     library: pruning, metadata coercion and defaulting of custom resources
//     (k8s.io/apiextensions-apiserver's schema packages), their validation and CEL
//     rules (crdstrategy.go: apiextensions-apiserver's customresource strategy,
//     written again around its validation, CEL and list-type packages; the
//     server's words), the generic metadata rules and preparation
//     (k8s.io/apiserver's rest.BeforeCreate/BeforeUpdate), server-side apply and
//     managedFields (k8s.io/apimachinery's managedfields, the real field manager,
//     with a CRD's OpenAPI models built as the API server's openapi builder builds
//     them: crdopenapi.go), merge, JSON and strategic merge patches,
//     resourceVersion and uid preconditions, finalizers holding a deleted object;
//   - the injected failures of a test case (failures.go) and the log of calls.
//
// What it does not model: built-in kinds' own validation and defaulting (they live
// in the kube-apiserver's source, not in a library: a Deployment is not defaulted),
// admission webhooks, watches, garbage collection of owned objects, and field or
// label selectors beyond equality-based and set-based label selectors; of the
// custom resource strategy, its selectable fields (no field selector on custom
// fields) and the ratcheting metric. The registry package of custom resources and
// the openapi builder are not linked (their etcd storage and grpc would double the
// luaop binary): tests hold the fake's strategy and models to theirs. e2e's parity
// test runs one table of requests through it and through a real API server.
package fakeapi
