package state

import (
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

	// Writing a record that the other storage never held writes nothing there.
	p = NewPatch()
	smartP.Store(obj, p, "other_fn", HandlerRecord{Started: &now})
	if _, touched := p.Map()["metadata"]; touched {
		t.Errorf("a write to annotations for a record they never held: %v", p.Map())
	}
}
