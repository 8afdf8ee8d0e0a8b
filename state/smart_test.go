package state

import (
	"reflect"
	"testing"
	"time"
)

// Switching storages never loses what the other one holds: records and the
// diff-base are read from either, written to the one in use, and the other's copy is
// cleared when the record is written again.
func TestSmartStoragesReadBothAndMoveRecordsOnWrite(t *testing.T) {
	annotationsP, statusP := NewAnnotationsProgress("luaop.dev"), NewStatusProgress("luaop_dev")
	annotationsD, statusD := NewAnnotationsDiffBase("luaop.dev"), NewStatusDiffBase("luaop_dev")
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

	// An object handled in annotations mode.
	p := NewPatch()
	annotationsP.Store(nil, p, "create_fn", HandlerRecord{Started: &now, Success: true, Purpose: "create"})
	if err := annotationsD.Store(nil, p, map[string]any{"spec": map[string]any{"size": int64(1)}}); err != nil {
		t.Fatal(err)
	}
	obj := applyMergePatch(map[string]any{"metadata": map[string]any{"name": "w"}}, p.Map())

	smartP, smartD := NewSmartProgress(statusP, annotationsP), NewSmartDiffBase(statusD, annotationsD)
	rec, ok := smartP.Fetch(obj, "create_fn")
	if !ok || !rec.Success {
		t.Fatalf("the record kept in annotations is not read in status mode: %+v %v", rec, ok)
	}
	essence, found, err := smartD.Fetch(obj)
	if err != nil || !found || essence["spec"] == nil {
		t.Fatalf("the diff-base kept in annotations is not read in status mode: %v %v %v", essence, found, err)
	}

	// Written again in status mode: moved, and the annotations' copies cleared.
	p = NewPatch()
	smartP.Store(obj, p, "create_fn", rec)
	if err := smartD.Store(obj, p, essence); err != nil {
		t.Fatal(err)
	}
	obj = applyMergePatch(obj, p.Map())
	// The old copies are cleared only by the patch sent after the one that writes
	// the new copies: if that write failed, the old ones must still be there.
	if _, ok := annotationsP.Fetch(obj, "create_fn"); !ok {
		t.Errorf("the annotations' record was cleared in the patch that writes the new one")
	}
	if _, found, _ := annotationsD.Fetch(obj); !found {
		t.Errorf("the annotations' diff-base was cleared in the patch that writes the new one")
	}
	after := p.TakeAfter()
	if after == nil || p.TakeAfter() != nil {
		t.Fatalf("the clearing of the annotations' copies is not in the patch's After, once: %v", after)
	}
	obj = applyMergePatch(obj, after.Map())
	if _, ok := annotationsP.Fetch(obj, "create_fn"); ok {
		t.Errorf("the annotations' record was not cleared")
	}
	if _, found, _ := annotationsD.Fetch(obj); found {
		t.Errorf("the annotations' diff-base was not cleared")
	}
	if rec, ok := statusP.Fetch(obj, "create_fn"); !ok || !rec.Success {
		t.Errorf("the record is not in status now")
	}
	if _, found, _ := statusD.Fetch(obj); !found {
		t.Errorf("the diff-base is not in status now")
	}

	// A purge clears both storages in one patch (cleared after, a failed write would
	// leave a stale record in the other storage, read once status has none).
	p = NewPatch()
	annotationsP.Store(nil, p, "update_fn", HandlerRecord{Started: &now, Success: true, Purpose: "update"})
	obj = applyMergePatch(obj, p.Map())
	p = NewPatch()
	smartP.Purge(obj, p, "update_fn")
	if p.TakeAfter() != nil {
		t.Errorf("a purge put something in After")
	}
	if _, ok := annotationsP.Fetch(applyMergePatch(obj, p.Map()), "update_fn"); ok {
		t.Errorf("a purge did not clear the annotations' record")
	}

	// Writing a record that the other storage never held writes nothing there.
	p = NewPatch()
	smartP.Store(obj, p, "other_fn", HandlerRecord{Started: &now})
	if _, touched := p.Map()["metadata"]; touched {
		t.Errorf("a write to annotations for a record they never held: %v", p.Map())
	}
}

// A diff-base that cannot be read where it is kept now (an edit by hand) does not hide
// a good one in the other storage; with none there, its error is reported.
func TestSmartDiffBaseFallsBackOverAnUnreadablePrimary(t *testing.T) {
	annotationsD, statusD := NewAnnotationsDiffBase("luaop.dev"), NewStatusDiffBase("luaop_dev")
	smartD := NewSmartDiffBase(statusD, annotationsD)
	p := NewPatch()
	if err := annotationsD.Store(nil, p, map[string]any{"spec": map[string]any{"size": int64(1)}}); err != nil {
		t.Fatal(err)
	}
	obj := applyMergePatch(map[string]any{"metadata": map[string]any{"name": "w"}}, p.Map())
	obj["status"] = map[string]any{"luaop_dev": map[string]any{"last-handled-configuration": "{not json"}}
	if _, found, err := statusD.Fetch(obj); err == nil {
		t.Fatalf("the broken status diff-base reads without an error (found %v): the test does not test", found)
	}
	essence, found, err := smartD.Fetch(obj)
	if err != nil || !found || essence["spec"] == nil {
		t.Fatalf("the annotations' diff-base behind a broken status one: %v %v %v", essence, found, err)
	}
	delete(obj["metadata"].(map[string]any), "annotations")
	if _, _, err := smartD.Fetch(obj); err == nil {
		t.Fatalf("a broken status diff-base and none in annotations: no error")
	}
}

// The fields handlers name are read without luaop's own bookkeeping, and the object
// itself is left as it was.
func TestWithoutBookkeeping(t *testing.T) {
	obj := map[string]any{
		"metadata": map[string]any{"name": "w", "annotations": map[string]any{
			"team": "a", "luaop.dev/last-handled-configuration": "{}", "luaop.dev/create_fn": "{}"}},
		"status": map[string]any{"phase": "running", "luaop_dev": map[string]any{"progress": map[string]any{}}},
	}
	got := WithoutBookkeeping(obj, "luaop.dev", "luaop_dev")
	want := map[string]any{
		"metadata": map[string]any{"name": "w", "annotations": map[string]any{"team": "a"}},
		"status":   map[string]any{"phase": "running"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, ok := obj["status"].(map[string]any)["luaop_dev"]; !ok || len(obj["metadata"].(map[string]any)["annotations"].(map[string]any)) != 3 {
		t.Errorf("the object itself was changed: %v", obj)
	}
	onlyOurs := map[string]any{"spec": map[string]any{}, "status": map[string]any{"luaop_dev": map[string]any{"progress": map[string]any{}}}}
	if s, ok := WithoutBookkeeping(onlyOurs, "luaop.dev", "luaop_dev")["status"]; ok {
		t.Errorf("a status holding only luaop's field: %v left, want none (as no status)", s)
	}
	only := map[string]any{"metadata": map[string]any{"annotations": map[string]any{"luaop.dev/x": "1"}}}
	if a, ok := WithoutBookkeeping(only, "luaop.dev", "luaop_dev")["metadata"].(map[string]any)["annotations"]; ok {
		t.Errorf("only luaop's annotations: %v left, want none (as no annotations)", a)
	}
}
