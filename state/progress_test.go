package state

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

var qualifiedName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

func checkKey(t *testing.T, prefix, key string) {
	t.Helper()
	name, ok := strings.CutPrefix(key, prefix+"/")
	if !ok || len(name) > 63 || !qualifiedName.MatchString(name) {
		t.Fatalf("invalid annotation key %q (name %d chars)", key, len(name))
	}
}

func TestAnnotationKey(t *testing.T) {
	long70 := strings.Repeat("h", 70)
	tests := []struct {
		name string
		id   string
		want string // exact key, or "" to only check validity
		len  int    // expected name length when want is ""
	}{
		{"short id", "create_fn", "p.io/create_fn", 0},
		{"subhandler", "parent/child", "p.io/parent.child", 0},
		{"colon", "fn:spec.size", "p.io/fn.spec.size", 0},
		{"63 exactly", strings.Repeat("a", 63), "p.io/" + strings.Repeat("a", 63), 0},
		{"64 is cut", strings.Repeat("a", 64), "", 63},
		{"very long", strings.Repeat("abc/", 50), "", 63},
		{"long with a separator at the cut", strings.Repeat("a", 51) + "/" + strings.Repeat("b", 20), "", 63},
		{"leading underscore", "_private", "", 0},
		{"trailing slash", "fn/", "", 0},
		{"only symbols", "///", "", 10},
		{"empty", "", "", 10},
		{"non-ascii", "función", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AnnotationKey("p.io", tt.id)
			checkKey(t, "p.io", got)
			if tt.want != "" && got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			if tt.len != 0 && len(got)-len("p.io/") != tt.len {
				t.Fatalf("name length %d, want %d", len(got)-len("p.io/"), tt.len)
			}
			if got != AnnotationKey("p.io", tt.id) {
				t.Fatal("not deterministic")
			}
		})
	}

	t.Run("long ids sharing a 70-char prefix differ", func(t *testing.T) {
		a, b := AnnotationKey("p.io", long70+"/one"), AnnotationKey("p.io", long70+"/two")
		if a == b {
			t.Fatalf("collision: %s", a)
		}
		if !strings.HasPrefix(a, "p.io/"+strings.Repeat("h", 52)+"-") {
			t.Fatalf("unexpected shape %s", a)
		}
	})
}

func TestHandlerRecordStates(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	later, earlier := now.Add(time.Minute), now.Add(-time.Minute)
	tests := []struct {
		name                      string
		rec                       HandlerRecord
		finished, sleeping, awake bool
	}{
		{"fresh", HandlerRecord{}, false, false, true},
		{"succeeded", HandlerRecord{Success: true}, true, false, false},
		{"failed", HandlerRecord{Failure: true}, true, false, false},
		{"delayed into the future", HandlerRecord{Delayed: &later}, false, true, false},
		{"delay passed", HandlerRecord{Delayed: &earlier}, false, false, true},
		{"delay is now", HandlerRecord{Delayed: &now}, false, false, true},
		{"finished while delayed", HandlerRecord{Success: true, Delayed: &later}, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.rec.Finished() != tt.finished || tt.rec.Sleeping(now) != tt.sleeping || tt.rec.Awake(now) != tt.awake {
				t.Fatalf("finished %v sleeping %v awake %v", tt.rec.Finished(), tt.rec.Sleeping(now), tt.rec.Awake(now))
			}
		})
	}
}

func storages() []struct {
	name string
	s    ProgressStorage
} {
	return []struct {
		name string
		s    ProgressStorage
	}{
		{"annotations", NewAnnotationsProgress(testPrefix)},
		{"status", NewStatusProgress("luaop")},
		{"status nested field", NewStatusProgress("luaop.handlers")},
	}
}

func sameRecord(a, b HandlerRecord) bool {
	sameTime := func(x, y *time.Time) bool { return (x == nil) == (y == nil) && (x == nil || x.Equal(*y)) }
	return sameTime(a.Started, b.Started) && sameTime(a.Stopped, b.Stopped) && sameTime(a.Delayed, b.Delayed) &&
		a.Purpose == b.Purpose && a.Retries == b.Retries && a.Success == b.Success && a.Failure == b.Failure &&
		a.Message == b.Message && slices.Equal(a.Subrefs, b.Subrefs)
}

func TestProgressRoundTrip(t *testing.T) {
	started := time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("CET", 3600))
	stopped := started.Add(time.Second)
	delayed := started.Add(time.Minute)
	full := HandlerRecord{Started: &started, Stopped: &stopped, Delayed: &delayed, Purpose: "update",
		Retries: 3, Success: true, Failure: true, Message: `boom "quoted" <x>`, Subrefs: []string{"p/a", "p/b"}}
	records := []struct {
		name string
		rec  HandlerRecord
	}{
		{"empty", HandlerRecord{}},
		{"first attempt", HandlerRecord{Started: &started, Purpose: "create"}},
		{"full", full},
	}
	ids := []string{"create_fn", "parent/child", strings.Repeat("x", 80) + "/sub"}
	base := `{"metadata":{"name":"n","annotations":{"other":"1"}},"spec":{"a":1},"status":{"luaop":{"keep":true}}}`
	for _, st := range storages() {
		for _, rc := range records {
			for _, id := range ids {
				t.Run(st.name+"/"+rc.name+"/"+id[:min(len(id), 12)], func(t *testing.T) {
					o := obj(t, base)
					if _, ok := st.s.Fetch(o, id); ok {
						t.Fatal("record found before storing")
					}
					p := NewPatch()
					st.s.Store(o, p, id, rc.rec)
					o2 := applyMergePatch(o, p.Map())
					got, ok := st.s.Fetch(o2, id)
					if !ok || !sameRecord(got, rc.rec) {
						t.Fatalf("fetched %+v, %v; want %+v", got, ok, rc.rec)
					}
					if got.Started != nil && got.Started.Location() != time.UTC {
						t.Fatal("times must come back as UTC")
					}
					if d := Compare(Essence(o, testPrefix), Essence(o2, testPrefix)); len(d) > 0 {
						t.Fatalf("storing progress changed the essence: %v", d)
					}
				})
			}
		}
	}
}

func TestProgressOverwriteClearsFields(t *testing.T) {
	later := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, st := range storages() {
		t.Run(st.name, func(t *testing.T) {
			o := obj(t, `{}`)
			p := NewPatch()
			st.s.Store(o, p, "h", HandlerRecord{Delayed: &later, Retries: 2, Message: "wait", Subrefs: []string{"x"}})
			o = applyMergePatch(o, p.Map())
			p = NewPatch()
			st.s.Store(o, p, "h", HandlerRecord{Success: true})
			o = applyMergePatch(o, p.Map())
			got, _ := st.s.Fetch(o, "h")
			if !sameRecord(got, HandlerRecord{Success: true}) {
				t.Fatalf("old fields survived the merge: %+v", got)
			}
		})
	}
}

func TestProgressPurge(t *testing.T) {
	for _, st := range storages() {
		t.Run(st.name+"/present", func(t *testing.T) {
			p := NewPatch()
			st.s.Store(obj(t, `{}`), p, "h", HandlerRecord{Retries: 1})
			o := applyMergePatch(obj(t, `{}`), p.Map())
			p = NewPatch()
			st.s.Purge(o, p, "h")
			if p.IsEmpty() {
				t.Fatal("purge of a present record wrote nothing")
			}
			o = applyMergePatch(o, p.Map())
			if _, ok := st.s.Fetch(o, "h"); ok {
				t.Fatal("record still present after purge")
			}
		})
		t.Run(st.name+"/absent", func(t *testing.T) {
			p := NewPatch()
			st.s.Purge(obj(t, `{"metadata":{"annotations":{"x":"y"}},"status":{}}`), p, "h")
			if !p.IsEmpty() {
				t.Fatalf("purge of an absent record wrote %s", mustJSON(t, p.Map()))
			}
		})
		t.Run(st.name+"/stored this cycle", func(t *testing.T) {
			o := obj(t, `{}`)
			p := NewPatch()
			st.s.Store(o, p, "h", HandlerRecord{Retries: 1})
			st.s.Purge(o, p, "h")
			if _, ok := st.s.Fetch(applyMergePatch(o, p.Map()), "h"); ok {
				t.Fatal("a record stored in the same cycle survived the purge")
			}
		})
	}
}

func TestFetchLenient(t *testing.T) {
	tests := []struct {
		name   string
		value  string
		wantOK bool
		want   HandlerRecord
	}{
		{"corrupt JSON", `{"retries":`, false, HandlerRecord{}},
		{"wrong types ignored", `{"retries":"x","success":"yes","started":"not a time","message":"m"}`, true, HandlerRecord{Message: "m"}},
		{"float retries", `{"retries":2.0}`, true, HandlerRecord{Retries: 2}},
	}
	s := NewAnnotationsProgress(testPrefix)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationKey(testPrefix, "h"): tt.value}}}
			got, ok := s.Fetch(o, "h")
			if ok != tt.wantOK || !sameRecord(got, tt.want) {
				t.Fatalf("got %+v, %v", got, ok)
			}
		})
	}
}

func TestStoredTimesAreRFC3339NanoUTC(t *testing.T) {
	ts := time.Date(2025, 3, 4, 5, 6, 7, 120000000, time.FixedZone("X", -7200))
	p := NewPatch()
	NewStatusProgress("luaop").Store(nil, p, "h", HandlerRecord{Started: &ts})
	got, _ := p.Get([]string{"status", "luaop", "progress", "h", "started"})
	if got != "2025-03-04T07:06:07.12Z" {
		t.Fatalf("got %v", got)
	}
}
