package state

import (
	"crypto/sha256"
	"encoding/base32"
	"slices"
	"strings"
	"time"
)

// HandlerRecord is the persisted progress of one handler for the current cause (kopf's progress
// record). It lives on the object itself so that retries, delays and outcomes survive operator
// restarts and are visible to users.
type HandlerRecord struct {
	Started *time.Time `json:"started,omitempty"` // first attempt
	Stopped *time.Time `json:"stopped,omitempty"` // finished (success or failure)
	Delayed *time.Time `json:"delayed,omitempty"` // do not run before this time
	Purpose string     `json:"purpose,omitempty"` // the reason it serves (create/update/...)
	Retries int        `json:"retries,omitempty"`
	Success bool       `json:"success,omitempty"`
	Failure bool       `json:"failure,omitempty"`
	Message string     `json:"message,omitempty"`
	Subrefs []string   `json:"subrefs,omitempty"`
}

// Finished reports whether the handler is done for this cause, whatever the outcome.
func (r HandlerRecord) Finished() bool { return r.Success || r.Failure }

// Sleeping reports whether the handler is unfinished and asked not to run before a later time.
func (r HandlerRecord) Sleeping(now time.Time) bool {
	return !r.Finished() && r.Delayed != nil && r.Delayed.After(now)
}

// Awake reports whether the handler may run now.
func (r HandlerRecord) Awake(now time.Time) bool { return !r.Finished() && !r.Sleeping(now) }

// ProgressStorage persists HandlerRecords on the object. Times are encoded as RFC3339Nano UTC.
type ProgressStorage interface {
	// Fetch reads a handler's record from the object (as received from the API).
	Fetch(obj map[string]any, handlerID string) (HandlerRecord, bool)
	// Store writes the record into the patch.
	Store(obj map[string]any, patch *Patch, handlerID string, rec HandlerRecord)
	// Purge deletes the record (writes null into the patch) only if obj has it.
	Purge(obj map[string]any, patch *Patch, handlerID string)
}

// The field names of a record as stored, shared by both storages.
const (
	fieldID      = "id"
	fieldStarted = "started"
	fieldStopped = "stopped"
	fieldDelayed = "delayed"
	fieldPurpose = "purpose"
	fieldRetries = "retries"
	fieldSuccess = "success"
	fieldFailure = "failure"
	fieldMessage = "message"
	fieldSubrefs = "subrefs"
)

var recordFields = []string{fieldStarted, fieldStopped, fieldDelayed, fieldPurpose, fieldRetries,
	fieldSuccess, fieldFailure, fieldMessage, fieldSubrefs}

// toMap encodes the record. With nulls, zero fields are written as nil: a status record is
// merge-patched field by field, so a field that became empty (say, delayed) must be deleted
// explicitly or the server would keep the old value.
func (r HandlerRecord) toMap(nulls bool) map[string]any {
	m := make(map[string]any, len(recordFields))
	put := func(k string, v any, zero bool) {
		if !zero {
			m[k] = v
		} else if nulls {
			m[k] = nil
		}
	}
	putTime := func(k string, t *time.Time) {
		if t == nil {
			put(k, nil, true)
		} else {
			put(k, t.UTC().Format(time.RFC3339Nano), false)
		}
	}
	putTime(fieldStarted, r.Started)
	putTime(fieldStopped, r.Stopped)
	putTime(fieldDelayed, r.Delayed)
	put(fieldPurpose, r.Purpose, r.Purpose == "")
	put(fieldRetries, int64(r.Retries), r.Retries == 0)
	put(fieldSuccess, r.Success, !r.Success)
	put(fieldFailure, r.Failure, !r.Failure)
	put(fieldMessage, r.Message, r.Message == "")
	subrefs := make([]any, len(r.Subrefs))
	for i, s := range r.Subrefs {
		subrefs[i] = s
	}
	put(fieldSubrefs, subrefs, len(r.Subrefs) == 0)
	return m
}

// recordFromMap is lenient: a field of the wrong type is ignored rather than failing the whole
// record, since users and other tools can edit the object.
func recordFromMap(m map[string]any) HandlerRecord {
	var r HandlerRecord
	getTime := func(k string) *time.Time {
		s, _ := m[k].(string)
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil
		}
		return &t
	}
	r.Started = getTime(fieldStarted)
	r.Stopped = getTime(fieldStopped)
	r.Delayed = getTime(fieldDelayed)
	r.Purpose, _ = m[fieldPurpose].(string)
	if n, ok := asNumber(m[fieldRetries]); ok {
		if n.isInt {
			r.Retries = int(n.i)
		} else {
			r.Retries = int(n.f)
		}
	}
	r.Success, _ = m[fieldSuccess].(bool)
	r.Failure, _ = m[fieldFailure].(bool)
	r.Message, _ = m[fieldMessage].(string)
	if list, ok := m[fieldSubrefs].([]any); ok {
		for _, e := range list {
			if s, ok := e.(string); ok {
				r.Subrefs = append(r.Subrefs, s)
			}
		}
	}
	return r
}

// NewAnnotationsProgress stores each record as JSON in annotation AnnotationKey(prefix, id).
// The JSON also carries the handler id, because the key may be shortened beyond recovery.
func NewAnnotationsProgress(prefix string) ProgressStorage {
	return annotationsProgress{prefix: prefix}
}

type annotationsProgress struct{ prefix string }

func (s annotationsProgress) Fetch(obj map[string]any, handlerID string) (HandlerRecord, bool) {
	raw, ok := annotations(obj)[AnnotationKey(s.prefix, handlerID)].(string)
	if !ok {
		return HandlerRecord{}, false
	}
	m, err := decodeJSONObject(raw)
	if err != nil {
		return HandlerRecord{}, false
	}
	return recordFromMap(m), true
}

func (s annotationsProgress) Store(obj map[string]any, patch *Patch, handlerID string, rec HandlerRecord) {
	m := rec.toMap(false)
	m[fieldID] = handlerID
	encoded, err := encodeJSON(m)
	if err != nil {
		panic("state: encoding a progress record: " + err.Error()) // only strings, bools, ints
	}
	patch.SetAnnotation(AnnotationKey(s.prefix, handlerID), &encoded)
	storeMarker(obj, patch, s.prefix)
}

func (s annotationsProgress) Purge(obj map[string]any, patch *Patch, handlerID string) {
	key := AnnotationKey(s.prefix, handlerID)
	if v, ok := annotations(obj)[key]; ok && v != nil {
		patch.SetAnnotation(key, nil)
	} else {
		// Nothing on the server to delete, but a record stored earlier in this cycle must go.
		patch.Unset([]string{"metadata", "annotations", key})
	}
}

// NewStatusProgress stores records in status.<field>.progress.<id> (id used verbatim as a map
// key). A dotted field names a nested path.
func NewStatusProgress(field string) ProgressStorage {
	base := append([]string{"status"}, ParsePath(field)...)
	return statusProgress{base: append(base, "progress")}
}

type statusProgress struct{ base []string }

func (s statusProgress) path(handlerID string) []string {
	return append(slices.Clip(s.base), handlerID)
}

func (s statusProgress) Fetch(obj map[string]any, handlerID string) (HandlerRecord, bool) {
	v, _ := Resolve(obj, s.path(handlerID))
	m, ok := v.(map[string]any)
	if !ok {
		return HandlerRecord{}, false
	}
	return recordFromMap(m), true
}

func (s statusProgress) Store(_ map[string]any, patch *Patch, handlerID string, rec HandlerRecord) {
	patch.Set(s.path(handlerID), rec.toMap(true))
}

func (s statusProgress) Purge(obj map[string]any, patch *Patch, handlerID string) {
	path := s.path(handlerID)
	if v, ok := Resolve(obj, path); ok && v != nil {
		patch.Set(path, nil)
	} else {
		patch.Unset(path)
	}
}

const (
	maxNameLen = 63
	hashLen    = 10
)

var hashEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// AnnotationKey builds a valid annotation key "<prefix>/<name>" for a handler id. The name must
// be a Kubernetes qualified name ([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, at most 63 chars),
// so other characters (such as '/' of subhandler ids "parent/child", or ':') become '.'.
// Names longer than 63 are cut and suffixed with "-" and 10 chars of a base32 sha256 of the full
// id, so two long ids with the same start never collide. A name that would start or end with a
// non-alphanumeric character gets the same treatment (with the leading ones trimmed).
func AnnotationKey(prefix, handlerID string) string {
	var b strings.Builder
	b.Grow(len(handlerID))
	for _, r := range handlerID {
		if isAlnum(r) || r == '-' || r == '_' || r == '.' {
			b.WriteRune(r)
		} else {
			b.WriteByte('.')
		}
	}
	name := b.String()
	if name != "" && len(name) <= maxNameLen && isAlnum(rune(name[0])) && isAlnum(rune(name[len(name)-1])) {
		return prefix + "/" + name
	}
	sum := sha256.Sum256([]byte(handlerID))
	hash := hashEncoding.EncodeToString(sum[:])[:hashLen]
	head := strings.TrimLeftFunc(name, func(r rune) bool { return !isAlnum(r) })
	if head == "" {
		return prefix + "/" + hash
	}
	return prefix + "/" + head[:min(len(head), maxNameLen-hashLen-1)] + "-" + hash
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}
