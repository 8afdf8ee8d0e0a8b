package processing

import (
	"fmt"
	"path"
	"strings"
)

// namespaceFilter decides which namespaces are served. Patterns use path.Match
// globs; a leading "!" excludes. With no include pattern every namespace is included.
type namespaceFilter struct {
	include, exclude []string
}

func newNamespaceFilter(patterns []string) (namespaceFilter, error) {
	var f namespaceFilter
	seen := map[string]bool{}
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		exclude := strings.HasPrefix(p, "!")
		if exclude {
			p = strings.TrimSpace(p[1:])
		}
		if p == "" {
			p = "*" // cluster-wide: no include restriction
		}
		if _, err := path.Match(p, ""); err != nil {
			return f, fmt.Errorf("namespace pattern %q: %w", p, err)
		}
		key := fmt.Sprint(exclude, p)
		if seen[key] {
			continue // the same namespace watched twice would deliver every event twice
		}
		seen[key] = true
		if exclude {
			f.exclude = append(f.exclude, p)
		} else {
			f.include = append(f.include, p)
		}
	}
	return f, nil
}

func (f namespaceFilter) allows(ns string) bool {
	for _, p := range f.exclude {
		if ok, _ := path.Match(p, ns); ok {
			return false
		}
	}
	if len(f.include) == 0 {
		return true
	}
	for _, p := range f.include {
		if ok, _ := path.Match(p, ns); ok {
			return true
		}
	}
	return false
}

// exactNamespaces returns the namespaces to watch one by one when every pattern is a
// plain name; otherwise nil, meaning: watch cluster-wide and filter.
func (f namespaceFilter) exactNamespaces() []string {
	if len(f.exclude) > 0 || len(f.include) == 0 {
		return nil
	}
	for _, p := range f.include {
		if strings.ContainsAny(p, "*?[") {
			return nil
		}
	}
	return f.include
}

// NamespaceMatcher tells which namespaces the patterns of Options.Namespaces serve,
// and, when every pattern is a plain name, those names (nil otherwise: list
// cluster-wide and filter).
func NamespaceMatcher(patterns []string) (allows func(namespace string) bool, exact []string, err error) {
	f, err := newNamespaceFilter(patterns)
	if err != nil {
		return nil, nil, err
	}
	return f.allows, f.exactNamespaces(), nil
}
