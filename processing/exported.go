package processing

import (
	"errors"

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

// ErrResourceNotServed is wrapped by ResolveResource's error when discovery
// answered that the group/version or the resource is not served; any other error
// (the server or the network failing) says nothing about the resource.
var ErrResourceNotServed = errors.New("resource not served")

// notServed is the message of a resource discovery says is not served; it is
// ErrResourceNotServed for errors.Is.
type notServed struct{ msg string }

func (e notServed) Error() string        { return e.msg }
func (e notServed) Is(target error) bool { return target == ErrResourceNotServed }

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
