package state

// Patch is a JSON merge patch (RFC 7386) being accumulated for one object in one cycle.
// A nil value means JSON null, i.e. delete the field on the server.
//
// All the changes of a cycle (handler results, progress, the diff-base, finalizers) go into one
// Patch so that the object is written once per cycle. The zero value is ready to use.
type Patch struct {
	m map[string]any
	// after holds removals to send only once this patch is written (After).
	after *Patch
}

// After is the patch of removals that must reach the server only after this one has:
// a smart storage clearing the copy of a diff-base or a progress record that the storage
// no longer in use holds, beside the new copy it writes here. When the two go to
// different endpoints (annotations and /status), removing first and then failing to
// write would leave no copy at all: a diff-base lost has the object handled as new, a
// record lost has its handler run again. Created on first use.
func (p *Patch) After() *Patch {
	if p.after == nil {
		p.after = NewPatch()
	}
	return p.after
}

// TakeAfter returns the removals of After (nil when there are none) and forgets them.
func (p *Patch) TakeAfter() *Patch {
	if p == nil || p.after.IsEmpty() {
		return nil
	}
	after := p.after
	p.after = nil
	return after
}

// NewPatch returns an empty patch.
func NewPatch() *Patch { return &Patch{m: map[string]any{}} }

// IsEmpty reports whether the patch has no top-level entries. A patch of only empty maps is not
// empty: by RFC 7386 {"spec": {}} creates spec when it is missing.
func (p *Patch) IsEmpty() bool { return p == nil || len(p.m) == 0 }

// Set puts value at path, creating intermediate maps and overwriting any non-map on the way
// (including a nil, which would otherwise delete the parent that the value now needs).
// An empty path replaces the whole patch when value is a map and is ignored otherwise.
func (p *Patch) Set(path []string, value any) {
	if len(path) == 0 {
		if m, ok := value.(map[string]any); ok && m != nil {
			p.m = m
		}
		return
	}
	cur := p.root()
	for _, key := range path[:len(path)-1] {
		next, ok := cur[key].(map[string]any)
		if !ok || next == nil {
			next = map[string]any{}
			cur[key] = next
		}
		cur = next
	}
	cur[path[len(path)-1]] = value
}

// Get returns the value at path; a nil value with ok=true is a pending deletion.
func (p *Patch) Get(path []string) (any, bool) {
	if p == nil {
		return nil, false
	}
	return Resolve(p.Map(), path)
}

// Unset removes path from the patch itself, as if it had never been set (unlike Set(path, nil),
// which asks the server to delete the field). Maps left empty by the removal are kept, since
// removing them could drop a deliberate {} elsewhere. It reports whether anything was removed.
func (p *Patch) Unset(path []string) bool {
	if p == nil || len(path) == 0 {
		return false
	}
	parent, ok := Resolve(p.m, path[:len(path)-1])
	m, isMap := parent.(map[string]any)
	if !ok || !isMap {
		return false
	}
	if _, ok := m[path[len(path)-1]]; !ok {
		return false
	}
	delete(m, path[len(path)-1])
	return true
}

// Merge deep-merges other into the patch: maps are merged recursively, everything else (lists,
// scalars, nil) replaces. Values taken from other are copied so that later changes to either
// side do not leak into the other.
func (p *Patch) Merge(other map[string]any) {
	mergeInto(p.root(), other)
}

func mergeInto(dst, src map[string]any) {
	for k, v := range src {
		if sv, ok := v.(map[string]any); ok && sv != nil {
			if dv, ok := dst[k].(map[string]any); ok && dv != nil {
				mergeInto(dv, sv)
				continue
			}
		}
		dst[k] = DeepCopyValue(v)
	}
}

// Map returns the underlying map, not a copy, so that callers (such as the Lua bridge) can edit
// the patch in place. It is never nil.
func (p *Patch) Map() map[string]any {
	if p == nil {
		return map[string]any{}
	}
	if p.m == nil {
		p.m = map[string]any{}
	}
	return p.m
}

// root is Map for writers: unlike Map it panics on a nil *Patch rather than silently dropping
// the write into a throwaway map.
func (p *Patch) root() map[string]any {
	if p.m == nil {
		p.m = map[string]any{}
	}
	return p.m
}

// SetAnnotation sets an annotation, or deletes it when value is nil.
func (p *Patch) SetAnnotation(key string, value *string) {
	var v any
	if value != nil {
		v = *value
	}
	p.Set([]string{"metadata", "annotations", key}, v)
}

// Split separates the patch for a resource whose status is a subresource: the server ignores
// status in a patch of the main resource and everything else in a patch of /status. Both
// results are complete request bodies: main holds every top-level key but "status", and status
// is {"status": ...}. Either is nil when it would be empty. The maps share values with the
// patch, which must not be changed while they are in use.
func (p *Patch) Split() (main, status map[string]any) {
	if p == nil {
		return nil, nil
	}
	for k, v := range p.m {
		if k == "status" {
			status = map[string]any{"status": v}
			continue
		}
		if main == nil {
			main = make(map[string]any, len(p.m))
		}
		main[k] = v
	}
	return main, status
}

// Changes tells whether applying merge patch to obj (RFC 7386) would change it: a field
// set to another value (numbers compared as numbers, 3 and 3.0 alike), a field deleted
// that obj has, or a map created where obj has none ({"status": {}} creates status).
// A write that changes nothing still costs the API server a request and every watcher
// an event (a new resourceVersion for managedFields alone): a daemon that writes the
// same status at every luaop.sleep must not send it.
func Changes(obj, patch map[string]any) bool {
	for k, v := range patch {
		cur, present := obj[k]
		switch pv := v.(type) {
		case nil:
			if present && cur != nil {
				return true
			}
		case map[string]any:
			cm, ok := cur.(map[string]any)
			if !ok || cm == nil {
				return true // created, or a non-map replaced by a map
			}
			if Changes(cm, pv) {
				return true
			}
		default:
			if !present || !ValuesEqual(cur, v) {
				return true
			}
		}
	}
	return false
}
