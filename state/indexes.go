package state

import (
	"sort"
	"sync"
)

// Indexes are operator-wide indexes built by per-object index functions (kopf's
// indexes): for every index, each object contributes key -> value entries, and a
// lookup returns every value under a key, across objects. Safe for concurrent use.
type Indexes struct {
	mu sync.RWMutex
	// index name -> object key -> that object's entries
	data map[string]map[string]map[string]any
}

// NewIndexes returns empty indexes.
func NewIndexes() *Indexes { return &Indexes{data: map[string]map[string]map[string]any{}} }

// Set replaces an object's entries in one index; nil or empty entries remove it.
func (x *Indexes) Set(index, object string, entries map[string]any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	byObject := x.data[index]
	if byObject == nil {
		byObject = map[string]map[string]any{}
		x.data[index] = byObject
	}
	if len(entries) == 0 {
		delete(byObject, object)
		return
	}
	byObject[object] = entries
}

// Remove drops an object from every index.
func (x *Indexes) Remove(object string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, byObject := range x.data {
		delete(byObject, object)
	}
}

// Declare makes an index exist (empty) so that lookups of a known index never fail.
func (x *Indexes) Declare(index string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.data[index] == nil {
		x.data[index] = map[string]map[string]any{}
	}
}

// Lookup returns one index as key -> values, values ordered by object key so that
// results are stable; ok is false for an index nobody declared.
func (x *Indexes) Lookup(index string) (map[string][]any, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	byObject, ok := x.data[index]
	if !ok {
		return nil, false
	}
	objects := make([]string, 0, len(byObject))
	for o := range byObject {
		objects = append(objects, o)
	}
	sort.Strings(objects)
	out := map[string][]any{}
	for _, o := range objects {
		for k, v := range byObject[o] {
			out[k] = append(out[k], v)
		}
	}
	return out, true
}
