package processing

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"

	"github.com/luaop/luaop/processing/causes"
)

// ResolvedResource is a resource as the operator resolves it from a script's spelling.
type ResolvedResource struct {
	GVR               schema.GroupVersionResource
	Kind              string
	Namespaced        bool
	StatusSubresource bool
}

// ResolveResource resolves a resource as scripts spell it (plural, singular, kind or
// short name) through discovery, as the operator does before watching it.
func ResolveResource(disco discovery.DiscoveryInterface, spelling causes.Resource) (ResolvedResource, error) {
	info, err := lookupResource(disco, spelling)
	if err != nil {
		return ResolvedResource{}, err
	}
	return ResolvedResource{GVR: info.gvr, Kind: info.kind, Namespaced: info.namespaced, StatusSubresource: info.statusSubresource}, nil
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
