package state

import (
	"testing"
)

// mergeAnnotations applies a patch's annotation changes to an object, as the server does.
func mergeAnnotations(obj map[string]any, p *Patch) {
	meta, _ := obj["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		obj["metadata"] = meta
	}
	a, _ := meta["annotations"].(map[string]any)
	if a == nil {
		a = map[string]any{}
		meta["annotations"] = a
	}
	pending, _ := p.Get([]string{"metadata", "annotations"})
	for k, v := range pending.(map[string]any) {
		if v == nil {
			delete(a, k)
		} else {
			a[k] = v
		}
	}
}

func annotationsSize(obj map[string]any) int {
	n := 0
	for k, v := range annotations(obj) {
		n += len(k) + annotationLen(v)
	}
	return n
}

// Issue 12.5: two operators with different prefixes fed on each other's annotations: each
// one's diff-base held the other's storage, so the annotations grew at every round and every
// event looked like an essential change. Each prefix now marks itself, and marked prefixes
// are left out of the essence.
func TestTwoPrefixesDoNotFeedOnEachOthersAnnotations(t *testing.T) {
	obj := map[string]any{"spec": map[string]any{"size": int64(1)},
		"metadata": map[string]any{"annotations": map[string]any{"team": "blue"}}}
	ops := []struct {
		diffBase DiffBaseStorage
		progress ProgressStorage
		prefix   string
	}{
		{NewAnnotationsDiffBase("a.luaop.dev"), NewAnnotationsProgress("a.luaop.dev"), "a.luaop.dev"},
		{NewAnnotationsDiffBase("b.luaop.dev"), NewAnnotationsProgress("b.luaop.dev"), "b.luaop.dev"},
	}
	var sizes []int
	for round := 0; round < 6; round++ {
		for _, op := range ops {
			essence := Essence(obj, op.prefix)
			stored, found, err := op.diffBase.Fetch(obj)
			if err != nil {
				t.Fatal(err)
			}
			if round > 0 && (!found || len(Compare(stored, essence)) > 0) {
				t.Fatalf("round %d: %s sees an essential change: %v", round, op.prefix, Compare(stored, essence))
			}
			p := NewPatch()
			op.progress.Store(obj, p, "update_fn", HandlerRecord{Retries: round + 1})
			if err := op.diffBase.Store(obj, p, essence); err != nil {
				t.Fatal(err)
			}
			mergeAnnotations(obj, p)
		}
		sizes = append(sizes, annotationsSize(obj))
	}
	for _, prefix := range []string{"a.luaop.dev", "b.luaop.dev"} {
		if annotations(obj)[ManagedKey(prefix)] != "yes" {
			t.Errorf("no marker %s: %v", ManagedKey(prefix), annotations(obj))
		}
		if _, kept := Essence(obj, prefix)["metadata"].(map[string]any)["annotations"].(map[string]any)["team"]; !kept {
			t.Errorf("%s: the user's annotation left the essence", prefix)
		}
	}
	for i := 2; i < len(sizes); i++ {
		if sizes[i] != sizes[1] {
			t.Fatalf("the annotations grow round after round: %v bytes", sizes)
		}
	}
}

func TestEssenceDropsMarkedPrefixesOnly(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		"other.example/luaop-managed": "yes", "other.example/last-handled-configuration": "{}",
		"kopfop.example/kopf-managed": "yes", "kopfop.example/handler1": "{}",
		"kopf.zalando.org/last-handled-configuration": "{}", "x.kopf.zalando.org/h": "{}",
		"unmarked.example/note": "kept", "own.example/anything": "dropped",
	}}}
	got := Essence(obj, "own.example")
	want := map[string]any{"metadata": map[string]any{"annotations": map[string]any{"unmarked.example/note": "kept"}}}
	if d := Compare(want, got); len(d) > 0 {
		t.Fatalf("essence %v, want %v", got, want)
	}
}

func TestMarkerIsWrittenOnceWithTheAnnotationsStorages(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{}}
	p := NewPatch()
	NewAnnotationsProgress(testPrefix).Store(obj, p, "h", HandlerRecord{Retries: 1})
	if v, _ := p.Get([]string{"metadata", "annotations", ManagedKey(testPrefix)}); v != "yes" {
		t.Fatalf("progress store wrote no marker: %v", p.Map())
	}
	mergeAnnotations(obj, p)
	p = NewPatch()
	if err := NewAnnotationsDiffBase(testPrefix).Store(obj, p, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if _, again := p.Get([]string{"metadata", "annotations", ManagedKey(testPrefix)}); again {
		t.Fatalf("the marker is rewritten although the object has it: %v", p.Map())
	}
	p = NewPatch()
	NewStatusProgress("luaop").Store(obj, p, "h", HandlerRecord{})
	if _, marked := p.Get([]string{"metadata", "annotations"}); marked {
		t.Fatalf("status storage wrote annotations: %v", p.Map())
	}
}
