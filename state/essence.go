package state

import (
	"errors"
	"fmt"
	"strings"
)

// lastAppliedAnnotation is rewritten by every `kubectl apply`, even when nothing else changes.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// maxAnnotationsSize is Kubernetes' limit on the total size (keys plus values) of all
// annotations of one object.
const maxAnnotationsSize = 256 * 1024

// ErrDiffBaseTooLarge is returned by StoreEssence when the diff-base annotation would push the
// object's annotations over the Kubernetes size limit; the API server would reject the whole
// patch, losing the progress that travels with it.
var ErrDiffBaseTooLarge = errors.New("the diff-base does not fit into the annotations size limit")

// ManagedMarker is the name of the annotation "<prefix>/luaop-managed" that the annotations
// storages write next to their records: it tells other operators (luaop or kopf, which writes
// "<prefix>/kopf-managed") that every annotation under that prefix is an operator's bookkeeping,
// not a change of the object. Without it two operators with different prefixes would each count
// the other's diff-base as an essential change and store it in their own: the annotations grow
// several times per round and update handlers run on every event (kopf's ping-pong).
const ManagedMarker = "luaop-managed"

// managedMarkers are the marker names of the operators whose prefixes are excluded from the
// essence: luaop's and kopf's.
var managedMarkers = map[string]bool{ManagedMarker: true, "kopf-managed": true}

// kopfDefaultPrefix is kopf's default prefix; it (and its subdomains) counts as marked, as in
// kopf, for kopf operators older than the markers.
const kopfDefaultPrefix = "kopf.zalando.org"

// ManagedKey is the marker annotation of a prefix.
func ManagedKey(prefix string) string { return prefix + "/" + ManagedMarker }

// markedPrefixes lists the prefixes of the annotations that operators marked as theirs.
func markedPrefixes(annotations map[string]any) map[string]bool {
	var out map[string]bool
	for k := range annotations {
		prefix, name, ok := strings.Cut(k, "/")
		if !ok {
			continue
		}
		if managedMarkers[name] || prefix == kopfDefaultPrefix || strings.HasSuffix(prefix, "."+kopfDefaultPrefix) {
			if out == nil {
				out = map[string]bool{}
			}
			out[prefix] = true
		}
	}
	return out
}

// storeMarker writes the prefix's marker annotation into the patch unless the object or the
// patch has it already.
func storeMarker(obj map[string]any, patch *Patch, prefix string) {
	key := ManagedKey(prefix)
	if _, ok := annotations(obj)[key]; ok {
		return
	}
	if _, ok := patch.Get([]string{"metadata", "annotations", key}); ok {
		return
	}
	yes := "yes"
	patch.SetAnnotation(key, &yes)
}

// ShardLabel is the label that gives an object to one replica when replicas share the
// objects (package sharding). The operator writes it itself, when it assigns or moves
// the object: like its own annotations, it is not part of the essence (moving an
// object between replicas is not a change of it).
func ShardLabel(prefix string) string { return prefix + "/shard" }

func withoutKey(m map[string]any, key string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// LastHandledKey is the annotation holding the essence last handled successfully (the diff-base).
func LastHandledKey(prefix string) string { return prefix + "/last-handled-configuration" }

// Essence is the part of an object whose changes are "real" changes (kopf's essence): the object
// without apiVersion, kind, status and metadata, but keeping metadata.labels and
// metadata.annotations, minus the label ShardLabel and the annotations under "<prefix>/", under any prefix marked as an
// operator's (ManagedMarker, kopf's marker) and kubectl's last-applied annotation. Those are excluded because the operator itself, or kubectl, rewrites them all the
// time; counting them would make the operator react to its own writes. Empty labels, annotations
// and metadata are dropped so that "no labels" equals "empty labels", and so are top-level nils.
// The result is a deep copy.
func Essence(obj map[string]any, prefix string) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		switch k {
		case "apiVersion", "kind", "status", "metadata":
			continue
		}
		if isNull(v) {
			continue
		}
		out[k] = DeepCopyValue(v)
	}
	meta, _ := obj["metadata"].(map[string]any)
	essMeta := map[string]any{}
	if labels, ok := meta["labels"].(map[string]any); ok && len(labels) > 0 {
		if _, sharded := labels[ShardLabel(prefix)]; sharded {
			labels = withoutKey(labels, ShardLabel(prefix))
		}
		if len(labels) > 0 {
			essMeta["labels"] = DeepCopyValue(labels)
		}
	}
	if annotations, ok := meta["annotations"].(map[string]any); ok {
		if kept := essentialAnnotations(annotations, prefix); len(kept) > 0 {
			essMeta["annotations"] = kept
		}
	}
	if len(essMeta) > 0 {
		out["metadata"] = essMeta
	}
	return out
}

// essentialAnnotations: the annotations without those Essence leaves out (the operators'
// own and kubectl's last-applied). Values are shared with annotations.
func essentialAnnotations(annotations map[string]any, prefix string) map[string]any {
	own := prefix + "/"
	marked := markedPrefixes(annotations)
	kept := map[string]any{}
	for k, v := range annotations {
		if k == lastAppliedAnnotation || strings.HasPrefix(k, own) {
			continue
		}
		if p, _, ok := strings.Cut(k, "/"); ok && marked[p] {
			continue
		}
		kept[k] = v
	}
	return kept
}

// WithoutBookkeeping is obj as the fields handlers name outside the essence must be read
// (metadata.annotations, status): without the annotations Essence leaves out and without
// status.<statusField>, where luaop keeps its progress and diff-base. Read there as they
// are, a handler on metadata.annotations or status would have luaop's own records in the
// essence, and every write of them would be a change (the stored diff-base then holds
// the one before: it grows with every write). A shallow copy where it differs; values
// are shared with obj.
func WithoutBookkeeping(obj map[string]any, prefix, statusField string) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		out[k] = v
	}
	if meta, ok := obj["metadata"].(map[string]any); ok {
		if annotations, ok := meta["annotations"].(map[string]any); ok {
			m := make(map[string]any, len(meta))
			for k, v := range meta {
				m[k] = v
			}
			if kept := essentialAnnotations(annotations, prefix); len(kept) > 0 {
				m["annotations"] = kept
			} else {
				delete(m, "annotations") // none left equals none, as in Essence
			}
			out["metadata"] = m
		}
	}
	if statusField != "" {
		out = withoutPath(out, append([]string{"status"}, ParsePath(statusField)...))
	}
	return out
}

// withoutPath: m without the value at path, and without the maps on the way that it
// leaves empty, copying the maps on the way; m itself when it has none.
func withoutPath(m map[string]any, path []string) map[string]any {
	v, ok := m[path[0]]
	if !ok {
		return m
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		out[k] = x
	}
	if len(path) == 1 {
		delete(out, path[0])
		return out
	}
	inner, isMap := v.(map[string]any)
	if !isMap {
		return m
	}
	// A map left empty goes too (an empty status equals none, as in Essence).
	if rest := withoutPath(inner, path[1:]); len(rest) > 0 {
		out[path[0]] = rest
	} else {
		delete(out, path[0])
	}
	return out
}

// EncodeEssence encodes an essence as canonical JSON (sorted keys, no HTML escaping), so that
// equal essences give byte-equal annotations and re-storing an unchanged one is a no-op.
func EncodeEssence(essence map[string]any) (string, error) {
	s, err := encodeJSON(essence)
	if err != nil {
		return "", fmt.Errorf("encoding the essence: %w", err)
	}
	return s, nil
}

// StoredEssence reads the diff-base annotation. A corrupt annotation is an error rather than
// "not found": the caller must decide whether treating the object as new is acceptable.
func StoredEssence(obj map[string]any, prefix string) (essence map[string]any, found bool, err error) {
	key := LastHandledKey(prefix)
	raw, ok := annotations(obj)[key]
	if !ok || raw == nil {
		return nil, false, nil
	}
	s, ok := raw.(string)
	if !ok {
		return nil, true, fmt.Errorf("annotation %s is a %T, not a string", key, raw)
	}
	m, err := decodeJSONObject(s)
	if err != nil {
		return nil, true, fmt.Errorf("decoding annotation %s: %w", key, err)
	}
	return m, true, nil
}

// StoreEssence writes the diff-base annotation (and the prefix's marker) into the patch. The size check counts the
// annotations the object will have once the patch is applied (the object's, with the patch's
// own annotation changes on top), because the server enforces the limit on that result.
// When the essence does not fit, it returns an error wrapping ErrDiffBaseTooLarge and writes
// nothing.
func StoreEssence(obj map[string]any, patch *Patch, prefix string, essence map[string]any) error {
	encoded, err := EncodeEssence(essence)
	if err != nil {
		return err
	}
	key := LastHandledKey(prefix)
	total := len(key) + len(encoded)
	after := annotationsAfter(obj, patch)
	for k, v := range after {
		if k != key {
			total += len(k) + annotationLen(v)
		}
	}
	if _, marked := after[ManagedKey(prefix)]; !marked {
		total += len(ManagedKey(prefix)) + len("yes")
	}
	if total > maxAnnotationsSize {
		return fmt.Errorf("%w: the annotations would take %d bytes (the diff-base %d), the limit is %d",
			ErrDiffBaseTooLarge, total, len(encoded), maxAnnotationsSize)
	}
	patch.SetAnnotation(key, &encoded)
	storeMarker(obj, patch, prefix)
	return nil
}

func annotations(obj map[string]any) map[string]any {
	meta, _ := obj["metadata"].(map[string]any)
	a, _ := meta["annotations"].(map[string]any)
	return a
}

// annotationsAfter is the object's annotations with the patch's annotation changes applied.
func annotationsAfter(obj map[string]any, patch *Patch) map[string]any {
	current := annotations(obj)
	pending, present := patch.Get([]string{"metadata", "annotations"})
	if !present {
		return current
	}
	pm, ok := pending.(map[string]any)
	if !ok {
		return nil // the patch deletes or replaces all annotations
	}
	out := make(map[string]any, len(current)+len(pm))
	for k, v := range current {
		out[k] = v
	}
	for k, v := range pm {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return out
}

func annotationLen(v any) int {
	if s, ok := v.(string); ok {
		return len(s)
	}
	s, _ := encodeJSON(v)
	return len(s)
}
