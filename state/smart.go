package state

import "fmt"

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
	// The other storage's copy of the record is cleared after the new one is written
	// (patch.After): cleared first, a failed write would lose the record, and a handler
	// that succeeded would run again. (Where the object holds no copy, Purge only drops
	// from the patch what this cycle stored there itself.)
	if _, held := s.fallback.Fetch(obj, handlerID); held {
		s.fallback.Purge(obj, patch.After(), handlerID)
	} else {
		s.fallback.Purge(obj, patch, handlerID)
	}
}

// Purge clears the record from both storages in the same patch. Where that patch is
// sent as two writes (a status subresource) and only the first lands, the record may
// be gone while the cause it belongs to is not recorded as done: its handler runs
// again (kopf's choice too). Cleared after instead, a failed write would leave a stale
// record in the other storage, read as the next cause's once the storage in use has
// none: a handler skipped.

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
	essence, found, err := s.primary.Fetch(obj)
	if found && err == nil {
		return essence, true, nil
	}
	// An unreadable diff-base in the storage in use (an edit by hand) does not hide a
	// good one in the other.
	if fe, ffound, ferr := s.fallback.Fetch(obj); ffound && ferr == nil {
		return fe, true, nil
	} else if err == nil {
		return fe, ffound, ferr
	}
	return essence, found, err
}

func (s smartDiffBase) Store(obj map[string]any, patch *Patch, essence map[string]any) error {
	if err := s.primary.Store(obj, patch, essence); err != nil {
		return err
	}
	// The other storage's copy is cleared after the new one is written (patch.After):
	// with no copy in either, the object would be handled as new.
	if p, ok := s.fallback.(diffBasePurger); ok {
		p.purge(obj, patch.After())
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
// status.<field>): for a resource whose server turned out to prune that field. obj is
// the object as the server has it now (for the annotations' size limit). The error
// says why the diff-base could not be moved (the progress records are, all the same).
func MoveStatusBookkeeping(ours map[string]any, prefix string, obj map[string]any, patch *Patch) error {
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
		essence, err := decodeJSONObject(encoded)
		if err != nil {
			return fmt.Errorf("the diff-base written into status does not decode: %w", err)
		}
		return StoreEssence(obj, patch, prefix, essence)
	}
	return nil
}
