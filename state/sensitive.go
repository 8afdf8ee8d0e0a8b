package state

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Sensitive values in the diff-base.
//
// The diff-base is the essence of an object as last handled, stored on the object
// itself (an annotation, or a field of status). For a Secret that essence holds its
// data: stored as it is, every Secret luaop handled would carry a copy of its values
// in an annotation, shown by `kubectl describe` and copied by the backup and audit
// tools that treat annotations as metadata (kopf does that). So the values at
// sensitive paths are stored as digests, and a stored digest is turned back into the
// value when the object still has a value of that digest: what changed is found as
// before, and only a changed (or removed) value is seen as its digest.
//
// What ctx.old holds at a sensitive path, then: the value itself where it did not
// change since it was last handled (the object's own value, its digest matched); a
// digest "sha256:<64 hex digits>" where it changed or is gone (the old value is not
// kept anywhere). ctx.new and the object's body always hold the values.
//
// The digest is an HMAC-SHA256 keyed with the object's uid, so equal values in two
// objects (or in two keys) do not show as equal digests and no table precomputed for
// all objects applies; it does not stop guessing a weak value of one object by brute
// force, which needs read access to that object (which already shows the value).

// digestPrefix starts every digest stored in place of a sensitive value.
const digestPrefix = "sha256:"

// SensitivePaths are the paths whose values an object's diff-base keeps as digests:
// a core Secret's data and stringData. A map at a sensitive path has each of its
// entries digested on its own (a field handler on data.password then sees only its
// key change), any other value is digested whole.
func SensitivePaths(obj map[string]any) [][]string {
	if obj["kind"] == "Secret" && obj["apiVersion"] == "v1" {
		return [][]string{{"data"}, {"stringData"}}
	}
	return nil
}

// NewDigestingDiffBase keeps the values at sensitive paths of inner's diff-base as
// digests (see the top of this file): SensitivePaths of the object, and extra, the
// paths handlers declared sensitive. heldKey names the stored essence's entry of
// held-back values (processing's: per handler, {"value": the value of its field it
// last handled}); for an object with sensitive paths they are kept as digests too,
// whatever field they are of, since a field handler's field may be a sensitive one.
func NewDigestingDiffBase(inner DiffBaseStorage, extra [][]string, heldKey string) DiffBaseStorage {
	return digestingDiffBase{inner: inner, extra: extra, heldKey: heldKey}
}

type digestingDiffBase struct {
	inner   DiffBaseStorage
	extra   [][]string
	heldKey string
}

func (d digestingDiffBase) paths(obj map[string]any) [][]string {
	return append(SensitivePaths(obj), d.extra...)
}

// Fetch reads the stored essence and turns every digest whose value the object still
// has back into that value.
func (d digestingDiffBase) Fetch(obj map[string]any) (map[string]any, bool, error) {
	essence, found, err := d.inner.Fetch(obj)
	if !found || err != nil {
		return essence, found, err
	}
	key := digestKey(obj)
	paths := d.paths(obj)
	for _, path := range paths {
		essence = restoreAt(essence, obj, path, key)
	}
	if len(paths) > 0 {
		essence = d.mapHeld(essence, func(v any) any { return restoreFromObject(v, obj, key) })
	}
	return essence, true, nil
}

// Store writes the essence with the values at sensitive paths replaced by digests.
func (d digestingDiffBase) Store(obj map[string]any, patch *Patch, essence map[string]any) error {
	essence = DigestSensitive(obj, essence, d.extra)
	if len(d.paths(obj)) > 0 {
		key := digestKey(obj)
		essence = d.mapHeld(essence, func(v any) any { return digestOne(v, key) })
	}
	return d.inner.Store(obj, patch, essence)
}

// mapHeld is essence with f applied to each held-back value (a copy where any).
func (d digestingDiffBase) mapHeld(essence map[string]any, f func(any) any) map[string]any {
	entries, ok := essence[d.heldKey].(map[string]any)
	if d.heldKey == "" || !ok {
		return essence
	}
	mapped := make(map[string]any, len(entries))
	for id, e := range entries {
		m, _ := e.(map[string]any)
		if v, present := m["value"]; present {
			e = map[string]any{"value": f(v)}
		}
		mapped[id] = e
	}
	return WithValue(essence, []string{d.heldKey}, mapped)
}

// restoreFromObject turns a digest back into the value of obj it is the digest of,
// searched among every value obj holds: a held-back value is of some field of obj,
// and where that field still has it, it is found; otherwise it stays a digest (the
// field changed, as its handler will be told).
func restoreFromObject(v any, obj map[string]any, key []byte) any {
	s, ok := v.(string)
	if !ok || !isDigest(s) {
		return v
	}
	var found any
	var walk func(x any) bool
	walk = func(x any) bool {
		if digestOne(x, key) == s {
			found = x
			return true
		}
		switch x := x.(type) {
		case map[string]any:
			for _, y := range x {
				if walk(y) {
					return true
				}
			}
		case []any:
			for _, y := range x {
				if walk(y) {
					return true
				}
			}
		}
		return false
	}
	if walk(obj) {
		return DeepCopyValue(found)
	}
	return v
}

// purge passes a smart storage's clearing on to the storage inside.
func (d digestingDiffBase) purge(obj map[string]any, patch *Patch) {
	if p, ok := d.inner.(diffBasePurger); ok {
		p.purge(obj, patch)
	}
}

// Refresh stores the diff-base again, into patch, when the object's stored one still
// holds a sensitive value as it is (written before digests, or by kopf), so that a
// cycle that changes nothing (no cause, or a resume) still takes the value off the
// object. It tells whether it wrote.
func (d digestingDiffBase) Refresh(obj map[string]any, patch *Patch) (bool, error) {
	if len(d.paths(obj)) == 0 {
		return false, nil // nothing sensitive: no read of the stored diff-base per cycle
	}
	stored, found, err := d.inner.Fetch(obj)
	if !found || err != nil || !d.holdsUndigested(obj, stored) && !d.holdsUndigestedHeld(obj, stored) {
		return false, nil
	}
	essence, _, _ := d.Fetch(obj)
	return true, d.Store(obj, patch, essence)
}

func (d digestingDiffBase) holdsUndigested(obj, essence map[string]any) bool {
	for _, path := range d.paths(obj) {
		if holdsUndigested(essence, path) {
			return true
		}
	}
	return false
}

// DigestSensitive is essence with the values at obj's sensitive paths (and extra)
// replaced by their digests; maps along the way are copied, essence is not written.
func DigestSensitive(obj, essence map[string]any, extra [][]string) map[string]any {
	key := digestKey(obj)
	for _, path := range append(SensitivePaths(obj), extra...) {
		v, ok := Resolve(essence, path)
		if !ok || v == nil {
			continue
		}
		essence = WithValue(essence, path, digestValue(v, key))
	}
	return essence
}

// digestValue is a map with each entry digested, or the digest of any other value.
// A value that is a digest already stays as it is.
func digestValue(v any, key []byte) any {
	if m, ok := v.(map[string]any); ok {
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[k] = digestOne(x, key)
		}
		return out
	}
	return digestOne(v, key)
}

func digestOne(v any, key []byte) any {
	if s, ok := v.(string); ok && isDigest(s) {
		return s
	}
	encoded, err := encodeJSON(v)
	if err != nil {
		encoded = "" // a value JSON cannot encode is not in an essence
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(encoded))
	return digestPrefix + hex.EncodeToString(mac.Sum(nil))
}

func isDigest(s string) bool {
	if len(s) != len(digestPrefix)+64 || !strings.HasPrefix(s, digestPrefix) {
		return false
	}
	_, err := hex.DecodeString(s[len(digestPrefix):])
	return err == nil
}

func digestKey(obj map[string]any) []byte {
	meta, _ := obj["metadata"].(map[string]any)
	uid, _ := meta["uid"].(string)
	return []byte(uid)
}

// restoreAt turns the digests stored at path (a map's entries, or one value) back
// into obj's values where obj's value has that digest.
func restoreAt(essence, obj map[string]any, path []string, key []byte) map[string]any {
	stored, ok := Resolve(essence, path)
	if !ok {
		return essence
	}
	current, _ := Resolve(obj, path)
	if m, isMap := stored.(map[string]any); isMap {
		cur, _ := current.(map[string]any)
		out := make(map[string]any, len(m))
		for k, x := range m {
			out[k] = restoreOne(x, cur[k], key)
		}
		return WithValue(essence, path, out)
	}
	return WithValue(essence, path, restoreOne(stored, current, key))
}

func restoreOne(stored, current any, key []byte) any {
	s, ok := stored.(string)
	if !ok || !isDigest(s) || current == nil {
		return stored
	}
	if digestOne(current, key) == s {
		return DeepCopyValue(current)
	}
	return stored
}

// holdsUndigestedHeld: for an object with sensitive paths, a held-back value that is
// not a digest.
func (d digestingDiffBase) holdsUndigestedHeld(obj, essence map[string]any) bool {
	if len(d.paths(obj)) == 0 {
		return false
	}
	entries, _ := essence[d.heldKey].(map[string]any)
	for _, e := range entries {
		m, _ := e.(map[string]any)
		if v, present := m["value"]; present {
			if s, ok := v.(string); !ok || !isDigest(s) {
				return true
			}
		}
	}
	return false
}

// holdsUndigested: the essence has a value at path (or in the map there) that is not
// a digest.
func holdsUndigested(essence map[string]any, path []string) bool {
	v, ok := Resolve(essence, path)
	if !ok || v == nil {
		return false
	}
	values := []any{v}
	if m, isMap := v.(map[string]any); isMap {
		values = values[:0]
		for _, x := range m {
			values = append(values, x)
		}
	}
	for _, x := range values {
		if s, ok := x.(string); !ok || !isDigest(s) {
			return true
		}
	}
	return false
}

// WithValue is m with v at path, the maps along the way copied (m is not written).
func WithValue(m map[string]any, path []string, v any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for k, x := range m {
		out[k] = x
	}
	if len(path) == 1 {
		out[path[0]] = v
		return out
	}
	child, _ := out[path[0]].(map[string]any)
	out[path[0]] = WithValue(child, path[1:], v)
	return out
}
