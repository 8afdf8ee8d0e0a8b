package sharding

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// meta is one object's metadata as a watch delivers it; label and handover are
// the shard label and handover annotation ("": absent).
type objMeta struct {
	name, version, label, handover string
	finalizers                     int
	deleting                       bool
	other                          string // another annotation (a handler's status write changes it)
}

func (o objMeta) object() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: o.name, ResourceVersion: o.version,
		Labels: map[string]string{"app": "x"}, Annotations: map[string]string{"luaop.dev/last-handled-configuration": `{"spec":{}}` + o.other}}}
	if o.label != "" {
		m.Labels["luaop.dev/shard"] = o.label
	}
	if o.handover != "" {
		m.Annotations["luaop.dev/shard-handover"] = o.handover
	}
	for i := range o.finalizers {
		m.Finalizers = append(m.Finalizers, fmt.Sprintf("example.com/f%d", i))
	}
	if o.deleting {
		m.DeletionTimestamp = &metav1.Time{Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}
	}
	return m
}

// storeStep is one call of the Reflector's: add, update, delete (of the object,
// or of its tombstone), replace (of the objects), or plan (a pass planning
// member for the object).
type storeStep struct {
	op      string
	objects []objMeta
	member  string
	wakes   bool
}

func (st storeStep) apply(t *testing.T, s *objectStore) {
	t.Helper()
	var err error
	switch st.op {
	case "add":
		err = s.Add(st.objects[0].object())
	case "update":
		err = s.Update(st.objects[0].object())
	case "delete":
		err = s.Delete(st.objects[0].object())
	case "delete tombstone":
		err = s.Delete(cache.DeletedFinalStateUnknown{Key: "default/" + st.objects[0].name, Obj: st.objects[0].object()})
	case "replace":
		var list []any
		for _, o := range st.objects {
			list = append(list, o.object())
		}
		err = s.Replace(list, "")
	case "plan":
		s.mu.Lock()
		r := s.objects["default/"+st.objects[0].name]
		r.planned = nameOf(st.member)
		s.objects["default/"+st.objects[0].name] = r
		s.mu.Unlock()
	default:
		t.Fatalf("no step %q", st.op)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// describe is the store's records, one line each, sorted.
func describe(s *objectStore) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for key, r := range s.objects {
		version := strconv.FormatUint(r.version, 10)
		if r.version == 0 {
			version = s.odd[key]
		}
		out = append(out, fmt.Sprintf("%s v%s label=%s handover=%s finalizers=%d deleting=%v planned=%s",
			key, version, r.label, r.handover, r.finalizers, r.deleting, r.planned))
	}
	slices.Sort(out)
	return out
}

// The store keeps per object what the coordinator decides on, wakes a pass on
// exactly what can change the plan or the writes (an object coming or going,
// its label, handover mark, deletion or finalizers; not a status write), keeps
// the planned member until the next pass, and a list (Replace) drops what it
// does not hold.
func TestObjectStore(t *testing.T) {
	w1 := objMeta{name: "w-1", version: "10", label: "a"}
	for _, tc := range []struct {
		name   string
		steps  []storeStep
		synced bool
		want   []string
	}{
		{"an added object is kept, without what the coordinator does not decide on", []storeStep{
			{op: "add", objects: []objMeta{{name: "w-1", version: "10", label: "a", handover: "b", finalizers: 2}}, wakes: true},
		}, false, []string{"default/w-1 v10 label=a handover=b finalizers=2 deleting=false planned="}},
		{"a status write changes the version and wakes nothing", []storeStep{
			{op: "add", objects: []objMeta{w1}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "11", label: "a", other: "x"}}},
		}, false, []string{"default/w-1 v11 label=a handover= finalizers=0 deleting=false planned="}},
		{"a label, a handover mark, a deletion, a finalizer each wake a pass", []storeStep{
			{op: "add", objects: []objMeta{w1}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "11", label: "b"}}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "12", label: "b", handover: "c"}}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "13", label: "b", handover: "c", finalizers: 1}}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "14", label: "b", handover: "c", finalizers: 1, deleting: true}}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "15", label: "b", handover: "c", deleting: true}}, wakes: true},
		}, false, []string{"default/w-1 v15 label=b handover=c finalizers=0 deleting=true planned="}},
		{"an update of an unknown object adds it", []storeStep{
			{op: "update", objects: []objMeta{w1}, wakes: true},
		}, false, []string{"default/w-1 v10 label=a handover= finalizers=0 deleting=false planned="}},
		{"the planned member stays through updates", []storeStep{
			{op: "add", objects: []objMeta{w1}, wakes: true},
			{op: "plan", objects: []objMeta{w1}, member: "b"},
			{op: "update", objects: []objMeta{{name: "w-1", version: "11", label: "a", handover: "b"}}, wakes: true},
		}, false, []string{"default/w-1 v11 label=a handover=b finalizers=0 deleting=false planned=b"}},
		{"a deletion forgets the object and wakes; of an unknown one, nothing", []storeStep{
			{op: "add", objects: []objMeta{w1}, wakes: true},
			{op: "add", objects: []objMeta{{name: "w-2", version: "20"}}, wakes: true},
			{op: "delete", objects: []objMeta{w1}, wakes: true},
			{op: "delete", objects: []objMeta{w1}},
			{op: "delete tombstone", objects: []objMeta{{name: "w-2"}}, wakes: true},
		}, false, nil},
		{"a first list syncs and wakes, even empty", []storeStep{
			{op: "replace", wakes: true},
		}, true, nil},
		{"a list drops what it does not hold, keeps the plan of what it does", []storeStep{
			{op: "replace", objects: []objMeta{w1, {name: "w-2", version: "20", label: "b"}}, wakes: true},
			{op: "plan", objects: []objMeta{w1}, member: "c"},
			{op: "replace", objects: []objMeta{{name: "w-1", version: "12", label: "a", other: "y"}}, wakes: true},
		}, true, []string{"default/w-1 v12 label=a handover= finalizers=0 deleting=false planned=c"}},
		{"a list of the same objects, with status writes only, wakes nothing", []storeStep{
			{op: "replace", objects: []objMeta{w1, {name: "w-2", version: "20", label: "b"}}, wakes: true},
			{op: "replace", objects: []objMeta{{name: "w-2", version: "21", label: "b", other: "z"}, {name: "w-1", version: "11", label: "a"}}},
		}, true, []string{
			"default/w-1 v11 label=a handover= finalizers=0 deleting=false planned=",
			"default/w-2 v21 label=b handover= finalizers=0 deleting=false planned=",
		}},
		{"a version that is not a decimal number is kept as it came, and forgotten with its object", []storeStep{
			{op: "add", objects: []objMeta{{name: "w-1", version: "007"}}, wakes: true},
			{op: "add", objects: []objMeta{{name: "w-2", version: "x9"}}, wakes: true},
			{op: "add", objects: []objMeta{{name: "w-3", version: "18446744073709551616"}}, wakes: true},
			{op: "add", objects: []objMeta{{name: "w-4", version: "5"}}, wakes: true},
			{op: "update", objects: []objMeta{{name: "w-1", version: "8"}}},
			{op: "update", objects: []objMeta{{name: "w-4", version: "0"}}},
			{op: "delete", objects: []objMeta{{name: "w-2"}}, wakes: true},
		}, false, []string{
			"default/w-1 v8 label= handover= finalizers=0 deleting=false planned=",
			"default/w-3 v18446744073709551616 label= handover= finalizers=0 deleting=false planned=",
			"default/w-4 v0 label= handover= finalizers=0 deleting=false planned=",
		}},
		{"a list replaces the versions that are not numbers", []storeStep{
			{op: "replace", objects: []objMeta{{name: "w-1", version: "a"}, {name: "w-2", version: "b"}}, wakes: true},
			{op: "replace", objects: []objMeta{{name: "w-1", version: "3"}, {name: "w-2", version: "c"}}},
		}, true, []string{
			"default/w-1 v3 label= handover= finalizers=0 deleting=false planned=",
			"default/w-2 vc label= handover= finalizers=0 deleting=false planned=",
		}},
		{"a list with a changed label or a new object wakes", []storeStep{
			{op: "replace", objects: []objMeta{w1}, wakes: true},
			{op: "replace", objects: []objMeta{{name: "w-1", version: "11", label: "b"}}, wakes: true},
			{op: "replace", objects: []objMeta{{name: "w-1", version: "11", label: "b"}, {name: "w-3", version: "30"}}, wakes: true},
		}, true, []string{
			"default/w-1 v11 label=b handover= finalizers=0 deleting=false planned=",
			"default/w-3 v30 label= handover= finalizers=0 deleting=false planned=",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			woken := 0
			s := newObjectStore("luaop.dev/shard", "luaop.dev/shard-handover", func() { woken++ })
			for i, st := range tc.steps {
				before := woken
				st.apply(t, s)
				if got := woken > before; got != st.wakes {
					t.Fatalf("step %d (%s %v): woke %v, want %v", i, st.op, st.objects, got, st.wakes)
				}
				if woken > before+1 {
					t.Fatalf("step %d (%s): woke %d times", i, st.op, woken-before)
				}
			}
			for key := range s.odd {
				if r, ok := s.objects[key]; !ok || r.version != 0 {
					t.Fatalf("the odd version of %s is kept beside its record %+v (%v)", key, r, ok)
				}
			}
			if got := describe(s); !slices.Equal(got, tc.want) {
				t.Fatalf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
			if s.hasSynced() != tc.synced {
				t.Fatalf("synced %v, want %v", s.hasSynced(), tc.synced)
			}
		})
	}
}

// A watch-list stream holds its objects in a store of its own until Replace:
// the store's transformer leaves them what the coordinator decides on only.
func TestObjectStoreTransformer(t *testing.T) {
	s := newObjectStore("luaop.dev/shard", "luaop.dev/shard-handover", func() {})
	got, err := s.Transformer()(objMeta{name: "w-1", version: "10", label: "a", handover: "b", finalizers: 1, deleting: true}.object())
	if err != nil {
		t.Fatal(err)
	}
	m := got.(*metav1.PartialObjectMetadata)
	if m.Name != "w-1" || m.Namespace != "default" || m.ResourceVersion != "10" || len(m.Finalizers) != 1 || m.DeletionTimestamp == nil ||
		!maps.Equal(m.Labels, map[string]string{"luaop.dev/shard": "a"}) || !maps.Equal(m.Annotations, map[string]string{"luaop.dev/shard-handover": "b"}) {
		t.Fatalf("trimmed to %+v", m.ObjectMeta)
	}
}
