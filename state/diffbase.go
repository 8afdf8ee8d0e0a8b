package state

import (
	"fmt"
	"strings"
)

// DiffBaseStorage keeps the last handled essence of an object (kopf's diff-base), the
// base that changes are detected against. Like kopf, two stores exist: an annotation
// (the default, readable with kubectl) and a field of status, which lets a whole
// cycle's bookkeeping go in one /status patch.
type DiffBaseStorage interface {
	// Fetch reads the stored essence; found is false when none was stored.
	Fetch(obj map[string]any) (essence map[string]any, found bool, err error)
	// Store writes the essence into the patch.
	Store(obj map[string]any, patch *Patch, essence map[string]any) error
}

// NewAnnotationsDiffBase stores the diff-base in the annotation
// <prefix>/last-handled-configuration.
func NewAnnotationsDiffBase(prefix string) DiffBaseStorage { return annotationsDiffBase{prefix} }

type annotationsDiffBase struct{ prefix string }

func (a annotationsDiffBase) Fetch(obj map[string]any) (map[string]any, bool, error) {
	return StoredEssence(obj, a.prefix)
}

func (a annotationsDiffBase) Store(obj map[string]any, patch *Patch, essence map[string]any) error {
	return StoreEssence(obj, patch, a.prefix, essence)
}

// NewStatusDiffBase stores the diff-base as a JSON string in
// status.<field>.last-handled-configuration (field may be dotted). The status schema
// must keep that field (x-kubernetes-preserve-unknown-fields, or declare it).
func NewStatusDiffBase(field string) DiffBaseStorage {
	return statusDiffBase{path: append(append([]string{"status"}, strings.Split(field, ".")...), "last-handled-configuration")}
}

type statusDiffBase struct{ path []string }

func (s statusDiffBase) Fetch(obj map[string]any) (map[string]any, bool, error) {
	raw, ok := Resolve(obj, s.path)
	if !ok || raw == nil {
		return nil, false, nil
	}
	str, ok := raw.(string)
	if !ok {
		return nil, true, fmt.Errorf("%s is a %T, not a string", strings.Join(s.path, "."), raw)
	}
	m, err := decodeJSONObject(str)
	if err != nil {
		return nil, true, fmt.Errorf("decoding %s: %w", strings.Join(s.path, "."), err)
	}
	return m, true, nil
}

func (s statusDiffBase) Store(_ map[string]any, patch *Patch, essence map[string]any) error {
	encoded, err := EncodeEssence(essence)
	if err != nil {
		return err
	}
	patch.Set(s.path, encoded)
	return nil
}
