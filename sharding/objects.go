package sharding

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unique"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// The coordinator's view of the objects of one resource in one namespace: an
// objectStore, which a client-go Reflector (list, then watch, of the objects'
// metadata) keeps current. It holds, per object, only what the coordinator
// decides on, in a record of 40 bytes in one map keyed by namespace/name:
// its resourceVersion (every write's precondition), its shard label, handover
// annotation, whether its deletion started and how many finalizers it has, and
// the member the last pass planned for it. The label, annotation and planned
// values are interned (a few member names for all the objects). A metadata
// informer kept a trimmed PartialObjectMetadata per object in its indexer (and
// its queue's and handler's buffers, grown to the first list), and the
// coordinator a plan map beside it: 836 bytes an object, 1,039 with the plan
// and a pass's items, against 138 and 184 now (BenchmarkCoordinatorStore, 10,000
// objects; the heap each holds, before the garbage collector's headroom).

// name is an interned string (unique.Handle: one pointer, compared as one; the
// string is freed once no record refers to it); the zero name is "".
type name struct{ h unique.Handle[string] }

func nameOf(s string) name {
	if s == "" {
		return name{}
	}
	return name{unique.Make(s)}
}

func (n name) String() string {
	if n == (name{}) {
		return ""
	}
	return n.h.Value()
}

// record is what the coordinator keeps of one object: 40 bytes.
type record struct {
	// version is the resourceVersion as a number: etcd's versions are decimal
	// numbers, and a string would double what a version costs (its header and
	// its bytes). Versions are opaque to clients, though: one of another form is
	// kept as it came, in the store's odd, and version is 0.
	version         uint64
	label, handover name
	// planned is the member the last pass planned for the object (zero: none
	// yet, or left out of the plan).
	planned    name
	finalizers int32
	deleting   bool // its deletionTimestamp is set
}

// gone tells whether the object is on its way out with nothing to hold it (a
// deletion without finalizers, as a Pod's grace period): it is not planned.
func (r *record) gone() bool { return r.deleting && r.finalizers == 0 }

// wakes tells whether a change from r to cur can change the plan or the writes
// (status writes of the handlers change none of these).
func (r *record) wakes(cur *record) bool {
	return r.label != cur.label || r.handover != cur.handover || r.deleting != cur.deleting || r.finalizers != cur.finalizers
}

// objectStore implements cache.ReflectorStore (and TransformingStore) for the
// coordinator's Reflectors.
type objectStore struct {
	label, handover string // the keys of the shard label and handover annotation
	wake            func() // told (no lock held) of a change that wakes a pass

	// mu is a leaf lock: it guards the fields below, held only in memory.
	mu      sync.Mutex
	objects map[string]record // namespace/name (cache.MetaNamespaceKeyFunc's key) -> record
	odd     map[string]string // key -> a version that is not a decimal number (none from etcd)
	synced  bool              // a first Replace (list) done
}

func newObjectStore(label, handover string, wake func()) *objectStore {
	return &objectStore{label: label, handover: handover, wake: wake, objects: map[string]record{}, odd: map[string]string{}}
}

// versionNumber is v as a number, when v is a decimal number without leading
// zeros (so that it prints back the same); 0 otherwise.
func versionNumber(v string) uint64 {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 || v[0] == '0' {
		return 0
	}
	return n
}

// recordOf is obj's record (planned left zero) and its version when that is not
// a number ("" when it is).
func (s *objectStore) recordOf(obj any) (key string, r record, odd string, err error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", record{}, "", fmt.Errorf("the shard coordinator's store: %w", err)
	}
	key = cache.MetaObjectToName(m).String()
	v := m.GetResourceVersion()
	n := versionNumber(v)
	if n == 0 {
		odd = strings.Clone(v) // a copy: it may be a slice of a larger decoded buffer
	}
	return key, record{
		version:    n,
		label:      nameOf(m.GetLabels()[s.label]),
		handover:   nameOf(m.GetAnnotations()[s.handover]),
		finalizers: int32(min(len(m.GetFinalizers()), 1<<31-1)),
		deleting:   m.GetDeletionTimestamp() != nil,
	}, odd, nil
}

// Add is the Reflector's (an object listed by a watch, or added).
func (s *objectStore) Add(obj any) error { return s.put(obj) }

// Update is the Reflector's.
func (s *objectStore) Update(obj any) error { return s.put(obj) }

func (s *objectStore) put(obj any) error {
	key, r, odd, err := s.recordOf(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	old, had := s.objects[key]
	r.planned = old.planned // the plan stays with the object until the next pass
	s.objects[key] = r
	setOdd(s.odd, key, odd)
	s.mu.Unlock()
	if !had || old.wakes(&r) {
		s.wake()
	}
	return nil
}

// Delete is the Reflector's.
func (s *objectStore) Delete(obj any) error {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return fmt.Errorf("the shard coordinator's store: %w", err)
	}
	s.mu.Lock()
	_, had := s.objects[key]
	delete(s.objects, key)
	setOdd(s.odd, key, "")
	s.mu.Unlock()
	if had {
		s.wake()
	}
	return nil
}

// Replace is the Reflector's, after a list: the objects not in list are gone.
// The records are made before the lock is taken, into a map of the list's size.
func (s *objectStore) Replace(list []any, _ string) error {
	objects, odds := make(map[string]record, len(list)), map[string]string{}
	for _, obj := range list {
		key, r, odd, err := s.recordOf(obj)
		if err != nil {
			return err
		}
		objects[key] = r
		setOdd(odds, key, odd)
	}
	s.mu.Lock()
	changed := !s.synced || len(objects) != len(s.objects)
	for key, r := range objects {
		old, had := s.objects[key]
		if had {
			r.planned = old.planned
			objects[key] = r
		}
		changed = changed || !had || old.wakes(&r)
	}
	s.objects, s.odd, s.synced = objects, odds, true
	s.mu.Unlock()
	if changed {
		s.wake()
	}
	return nil
}

// Resync is the Reflector's: nothing to do (no resync period).
func (s *objectStore) Resync() error { return nil }

// Transformer trims the objects a watch-list stream (the Reflector's list by a
// watch) collects in a store of its own before Replace.
func (s *objectStore) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			return decisionMetadata(m, s.label, s.handover), nil
		}
		return obj, nil
	}
}

// hasSynced tells whether the first list is in.
func (s *objectStore) hasSynced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// setOdd records key's version when it is not a number (odd != ""), and
// forgets it when it is.
func setOdd(odds map[string]string, key, odd string) {
	switch {
	case odd != "":
		odds[key] = odd
	case len(odds) > 0:
		delete(odds, key)
	}
}

// get is key's record and its resourceVersion.
func (s *objectStore) get(key string) (r record, version string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok = s.objects[key]
	if r.version != 0 {
		return r, strconv.FormatUint(r.version, 10), ok
	}
	return r, s.odd[key], ok
}

// decisionMetadata is what the coordinator needs of an object, as a new
// PartialObjectMetadata with its name, namespace, version, shard label,
// handover annotation, finalizers and deletion only: what a watch-list stream
// holds until the store's Replace.
func decisionMetadata(m *metav1.PartialObjectMetadata, label, handover string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, ResourceVersion: m.ResourceVersion,
		Labels: onlyKey(m.Labels, label), Annotations: onlyKey(m.Annotations, handover),
		Finalizers: m.Finalizers, DeletionTimestamp: m.DeletionTimestamp,
	}}
}

// onlyKey is m with key alone (nil without it).
func onlyKey(m map[string]string, key string) map[string]string {
	v, ok := m[key]
	if !ok {
		return nil
	}
	return map[string]string{key: v}
}
