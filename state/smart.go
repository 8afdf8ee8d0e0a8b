package state

// Smart storages let an operator change where it keeps its bookkeeping without
// handling anything twice (kopf's "smart" storage): they read from the storage in
// use, then from the other one, write to the one in use only, and clear what the
// other one still holds for the same record when they write.

// NewSmartProgress keeps progress in primary and still reads what fallback holds.
func NewSmartProgress(primary, fallback ProgressStorage) ProgressStorage {
	return smartProgress{primary, fallback}
}

type smartProgress struct{ primary, fallback ProgressStorage }

func (s smartProgress) Fetch(obj map[string]any, handlerID string) (HandlerRecord, bool) {
	if rec, ok := s.primary.Fetch(obj, handlerID); ok {
		return rec, true
	}
	return s.fallback.Fetch(obj, handlerID)
}

func (s smartProgress) Store(obj map[string]any, patch *Patch, handlerID string, rec HandlerRecord) {
	s.primary.Store(obj, patch, handlerID, rec)
	s.fallback.Purge(obj, patch, handlerID) // writes only when the object holds one
}

func (s smartProgress) Purge(obj map[string]any, patch *Patch, handlerID string) {
	s.primary.Purge(obj, patch, handlerID)
	s.fallback.Purge(obj, patch, handlerID)
}

// NewSmartDiffBase keeps the diff-base in primary and still reads fallback's.
func NewSmartDiffBase(primary, fallback DiffBaseStorage) DiffBaseStorage {
	return smartDiffBase{primary, fallback}
}

type smartDiffBase struct{ primary, fallback DiffBaseStorage }

func (s smartDiffBase) Fetch(obj map[string]any) (map[string]any, bool, error) {
	if essence, found, err := s.primary.Fetch(obj); found || err != nil {
		return essence, found, err
	}
	return s.fallback.Fetch(obj)
}

func (s smartDiffBase) Store(obj map[string]any, patch *Patch, essence map[string]any) error {
	if err := s.primary.Store(obj, patch, essence); err != nil {
		return err
	}
	if p, ok := s.fallback.(diffBasePurger); ok {
		p.purge(obj, patch)
	}
	return nil
}

// diffBasePurger clears a stored diff-base, writing only when the object holds one.
type diffBasePurger interface {
	purge(obj map[string]any, patch *Patch)
}

func (a annotationsDiffBase) purge(obj map[string]any, patch *Patch) {
	key := LastHandledKey(a.prefix)
	if _, ok := annotations(obj)[key]; ok {
		patch.SetAnnotation(key, nil)
	}
}

func (s statusDiffBase) purge(obj map[string]any, patch *Patch) {
	if v, ok := Resolve(obj, s.path); ok && v != nil {
		patch.Set(s.path, nil)
	}
}

// MoveStatusBookkeeping writes into patch, as annotations under prefix, the progress
// records and diff-base that status storage held in ours (the content of
// status.<field>): for a resource whose server turned out to prune that field.
func MoveStatusBookkeeping(ours map[string]any, prefix string, obj map[string]any, patch *Patch) {
	annotationsP := NewAnnotationsProgress(prefix)
	if progress, ok := ours["progress"].(map[string]any); ok {
		for id, raw := range progress {
			if rec, ok := raw.(map[string]any); ok {
				annotationsP.Store(obj, patch, id, recordFromMap(rec))
			} else if raw == nil {
				annotationsP.Purge(obj, patch, id)
			}
		}
	}
	if encoded, ok := ours["last-handled-configuration"].(string); ok {
		if essence, err := decodeJSONObject(encoded); err == nil {
			_ = StoreEssence(obj, patch, prefix, essence)
		}
	}
}
