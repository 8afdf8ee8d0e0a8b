// Package caching is the operator's informer cache: one shared client-go informer per
// View (a resource, a namespace, the label and field selectors the API server applies,
// whole objects or metadata only), the reads the scripts' luaop.kube.get and list make
// of it, and the derivation of a watch's selectors from its handlers' filters.
//
// # Who owns what
//
//   - The Cache owns the views and their informers. A view is started by its first
//     Acquire, under that caller's context, and stopped when its last Handle is
//     released (or that context ends); every holder of the same View shares one
//     informer and one store. Holders (processing's watchers, its declared reads,
//     and later the watches of related resources) add their event handlers to the
//     informer and remove them before they release it. A leaf mutex guards the map
//     of views and their hold counts.
//   - Reads (Get, List) are answered by the views whose holders let them serve
//     reads (Acquire's serveReads): a replica's share of sharded objects does not.
//     A Get of an object missing from a view that holds the whole namespace is
//     NotFound. A Get missing from views that all select by label, and a List no
//     single view holds completely (no view's label selector is implied by the
//     list's), are ErrPartial and ErrNotCached: the caller reads the API server, and
//     the cache says it once with what to declare (one script's selected watch must
//     not change what another's read returns). A read of a resource no view holds
//     there is ErrNotCached, which the caller answers from the API server. Label selectors of a list use an index of the
//     label, added to the store on the first list that selects by it.
//   - Read-your-own-writes (expect.go): the writes the scripts' client announces
//     (Wrote) are expectations per view, behind the view's leaf mutex; a read waits
//     for the ones it concerns, settled by the informer's notifications. The cache
//     never reads the API server itself.
//   - Union and Covers (selection.go) are pure functions over a small data form of
//     the handlers' filters (HandlerFilter): table-tested, no state.
//
// No lock is held while calling client-go (the stores have their own locks) or a
// holder's code. Objects in the stores are shared: nobody modifies them.
//
// It imports client-go and apimachinery only: no package of luaop's. processing
// (watches), kubeclient (reads, writes) and operator (assembly) import it.
package caching
