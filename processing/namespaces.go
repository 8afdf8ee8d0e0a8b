package processing

import (
	"path"
	"strings"
)

// namespaceFilter decides which namespaces are served. Patterns use path.Match
// globs; a leading "!" excludes. With no include pattern every namespace is included.
type namespaceFilter struct {
	include, exclude []string
}

func newNamespaceFilter(patterns []string) namespaceFilter {
	var f namespaceFilter
	for _, p := range patterns {
		p = strings.TrimSpace(p)
		switch {
		case p == "" || p == "*":
			// cluster-wide: no include restriction
			f.include = append(f.include, "*")
		case strings.HasPrefix(p, "!"):
			f.exclude = append(f.exclude, p[1:])
		default:
			f.include = append(f.include, p)
		}
	}
	return f
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
