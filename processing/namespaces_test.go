package processing

import (
	"slices"
	"testing"
)

func TestNamespaceFilter(t *testing.T) {
	tests := []struct {
		name      string
		patterns  []string
		allowed   []string
		denied    []string
		wantExact []string // nil: watch cluster-wide and filter
	}{
		{name: "no patterns is cluster-wide", patterns: nil,
			allowed: []string{"default", "kube-system", "team-a"}},
		{name: "empty pattern is cluster-wide", patterns: []string{""},
			allowed: []string{"default", "kube-system"}},
		{name: "blank pattern is cluster-wide", patterns: []string{"  "},
			allowed: []string{"default", "kube-system"}},
		{name: "star is cluster-wide", patterns: []string{"*"},
			allowed: []string{"default", "kube-system", "team-a"}},
		{name: "one exact name", patterns: []string{"team-a"},
			allowed: []string{"team-a"}, denied: []string{"team-b", "team-a-dev", "default", "xteam-a"},
			wantExact: []string{"team-a"}},
		{name: "several exact names keep their order", patterns: []string{"team-b", "team-a"},
			allowed: []string{"team-a", "team-b"}, denied: []string{"team-c", "default"},
			wantExact: []string{"team-b", "team-a"}},
		{name: "names are trimmed", patterns: []string{" team-a ", "\tteam-b"},
			allowed: []string{"team-a", "team-b"}, denied: []string{" team-a "},
			wantExact: []string{"team-a", "team-b"}},
		{name: "star glob", patterns: []string{"team-*"},
			allowed: []string{"team-a", "team-", "team-backend"}, denied: []string{"default", "my-team-a", "team"}},
		{name: "question mark glob", patterns: []string{"team-?"},
			allowed: []string{"team-a", "team-b"}, denied: []string{"team-ab", "team-"}},
		{name: "character class glob", patterns: []string{"team-[ab]"},
			allowed: []string{"team-a", "team-b"}, denied: []string{"team-c"}},
		{name: "an exact name mixed with a glob watches cluster-wide", patterns: []string{"default", "team-*"},
			allowed: []string{"default", "team-a"}, denied: []string{"kube-system"}},
		{name: "exclusion only: everything else", patterns: []string{"!kube-*"},
			allowed: []string{"default", "team-a", "kubeflow"}, denied: []string{"kube-system", "kube-public", "kube-"}},
		{name: "exact exclusion only", patterns: []string{"!kube-system"},
			allowed: []string{"default", "kube-public"}, denied: []string{"kube-system"}},
		{name: "glob with an exclusion", patterns: []string{"team-*", "!team-secret"},
			allowed: []string{"team-a", "team-public"}, denied: []string{"team-secret", "default"}},
		{name: "exclusion wins over an exact name", patterns: []string{"team-a", "team-b", "!team-a"},
			allowed: []string{"team-b"}, denied: []string{"team-a", "default"}},
		{name: "exclusion wins regardless of order", patterns: []string{"!team-a", "team-*"},
			allowed: []string{"team-b"}, denied: []string{"team-a"}},
		{name: "cluster-wide with exclusions", patterns: []string{"", "!kube-*", "!openshift-*"},
			allowed: []string{"default", "team-a"}, denied: []string{"kube-system", "openshift-monitoring"}},
		{name: "star with an exact name is still cluster-wide", patterns: []string{"*", "team-a"},
			allowed: []string{"default", "team-a"}},
		{name: "a name given twice is watched once", patterns: []string{"team-a", " team-a", "team-a"},
			allowed: []string{"team-a"}, denied: []string{"team-b"}, wantExact: []string{"team-a"}},
		{name: "a space after ! still excludes", patterns: []string{"! kube-system"},
			allowed: []string{"default"}, denied: []string{"kube-system"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := newNamespaceFilter(tt.patterns)
			if err != nil {
				t.Fatal(err)
			}
			for _, ns := range tt.allowed {
				if !f.allows(ns) {
					t.Errorf("allows(%q) = false, want true", ns)
				}
			}
			for _, ns := range tt.denied {
				if f.allows(ns) {
					t.Errorf("allows(%q) = true, want false", ns)
				}
			}
			got := f.exactNamespaces()
			if (got == nil) != (tt.wantExact == nil) || !slices.Equal(got, tt.wantExact) {
				t.Errorf("exactNamespaces = %#v, want %#v", got, tt.wantExact)
			}
		})
	}
}

func TestNamespaceFilterRejectsBadGlobs(t *testing.T) {
	if _, err := newNamespaceFilter([]string{"team-["}); err == nil {
		t.Fatal("an invalid glob must be refused at start, not silently match nothing")
	}
}
