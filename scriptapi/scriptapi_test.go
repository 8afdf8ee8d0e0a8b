package scriptapi

import (
	"slices"
	"testing"
)

// The table is well formed: one entry a name, registration functions take their
// handler and options where the analyser looks for them, cluster access has verbs.
func TestTableIsWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, f := range Functions {
		if seen[f.Name] {
			t.Errorf("luaop.%s is listed twice", f.Name)
		}
		seen[f.Name] = true
		if f.Registers != "" {
			if !slices.Contains(HandlerKinds, f.Registers) {
				t.Errorf("luaop.%s registers %q, not one of HandlerKinds", f.Name, f.Registers)
			}
			if f.Param("fn") < 0 || f.Param("opts") != len(f.Params)-1 {
				t.Errorf("luaop.%s(%v): a registration function takes fn, then opts last", f.Name, f.Params)
			}
		}
		if f.Access.Target != NoCluster && (len(f.Access.Verbs) == 0 || !slices.Contains(Targets, f.Access.Target)) {
			t.Errorf("luaop.%s: access %+v needs a known target and verbs", f.Name, f.Access)
		}
		if f.Access.Target == NoCluster && len(f.Access.Verbs) > 0 {
			t.Errorf("luaop.%s: verbs %v without a target", f.Name, f.Access.Verbs)
		}
	}
	if f, ok := Lookup("kube.apply"); !ok || !slices.Equal(f.Access.Verbs, []string{"create", "patch"}) {
		t.Errorf("kube.apply = %+v, %v", f, ok)
	}
	if _, ok := Lookup("kube.watch"); ok {
		t.Error("Lookup found a function the table does not list")
	}
	if !IsHandlerOption("cancellation_backoff") || IsHandlerOption("bogus") {
		t.Error("IsHandlerOption")
	}
}
