// Package state holds the pure data rules by which luaop decides what changed in an object and
// records what it has done about it: merge patches, the essence and its stored diff-base,
// kopf-style diffs, the per-handler progress records, and Indexes, the operator-wide indexes
// built by index handlers (the one type here shared across objects: safe for concurrent use).
//
// Nothing here performs I/O. Objects are the map[string]any trees produced by client-go's
// unstructured JSON decoding, so every function tolerates the numeric types that decoding (or a
// Lua conversion) may yield: int64, float64, int, json.Number and the other Go numeric kinds all
// compare by value. A nil value inside an object means JSON null, which in a merge patch is a
// deletion and in a diff is the same as an absent key; keeping those two views aligned is what
// lets a diff be replayed as a merge patch (FuzzCompareApply checks it).
//
// A Patch, with its After part (what must be sent only once the patch itself is written),
// belongs to the one cycle that builds and sends it; nothing here keeps it.
//
// It imports no luaop package and must not: the layers above (processing,
// scripttest, admission, sharding, kubeclient, the tests' ledger) all read its
// rules, so that each lives here once.
package state
