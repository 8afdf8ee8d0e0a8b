package kubeclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// Manifest is one object read from a file, with where it came from.
type Manifest struct {
	Object *unstructured.Unstructured
	// Source is "file" or "file#N" (the N-th document of the file, from 1).
	Source string
}

// ReadManifests reads the objects of YAML or JSON files, and of the *.yaml, *.yml and
// *.json files of folders (not below them, as kubectl apply -f DIR), in name order.
// A file may hold several documents; kind: List is expanded.
func ReadManifests(paths ...string) ([]Manifest, error) {
	var out []Manifest
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("reading manifests: %w", err)
		}
		files := []string{p}
		if st.IsDir() {
			entries, err := os.ReadDir(p)
			if err != nil {
				return nil, fmt.Errorf("reading manifests: %w", err)
			}
			files = nil
			for _, e := range entries {
				switch filepath.Ext(e.Name()) {
				case ".yaml", ".yml", ".json":
					if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
						files = append(files, filepath.Join(p, e.Name()))
					}
				}
			}
			if len(files) == 0 {
				return nil, fmt.Errorf("reading manifests: %s holds no *.yaml, *.yml or *.json file", p)
			}
		}
		for _, f := range files {
			objs, err := readManifestFile(f)
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
	}
	return out, nil
}

func readManifestFile(file string) ([]Manifest, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading manifests: %w", err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []Manifest
	for doc := 1; ; doc++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", file, doc, err)
		}
		if len(m) == 0 {
			continue
		}
		source := fmt.Sprintf("%s#%d", file, doc)
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", source, err)
			}
			for i := range list.Items {
				out = append(out, Manifest{Object: &list.Items[i], Source: source})
			}
			continue
		}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: an object needs apiVersion, kind and metadata.name", source)
		}
		out = append(out, Manifest{Object: u, Source: source})
	}
}

// ApplyOptions configure ApplyManifests.
type ApplyOptions struct {
	// FieldManager owns the applied fields. Defaults to "luaop-apply" (not the
	// operator's own field manager).
	FieldManager string
	// Namespace is given to namespaced objects without one. Defaults to "default".
	Namespace string
	// Progress, when set, is told about each object applied ("created", "configured"
	// or "unchanged") and each CRD established.
	Progress func(what, source, result string)
	// Timeout bounds the wait for CRDs to be Established and for their resources to be
	// served. Defaults to 60s.
	Timeout time.Duration
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ApplyManifests applies objects with server-side apply (forcing conflicts, as
// kubectl apply --server-side --force-conflicts): CustomResourceDefinitions first,
// waiting until each is Established, then Namespaces, then the rest in order.
// Objects of a resource that is not served yet (a CRD just established) are retried
// until opts.Timeout.
func (c *Client) ApplyManifests(ctx context.Context, manifests []Manifest, opts ApplyOptions) error {
	if opts.FieldManager == "" {
		opts.FieldManager = "luaop-apply"
	}
	if opts.Namespace == "" {
		opts.Namespace = metav1.NamespaceDefault
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Minute
	}
	if opts.Progress == nil {
		opts.Progress = func(string, string, string) {}
	}
	rank := func(m Manifest) int {
		switch gvk := m.Object.GroupVersionKind(); {
		case gvk.Group == crdGVR.Group && gvk.Kind == "CustomResourceDefinition":
			return 0
		case gvk.Group == "" && gvk.Kind == "Namespace":
			return 1
		}
		return 2
	}
	ordered := slices.Clone(manifests)
	slices.SortStableFunc(ordered, func(a, b Manifest) int { return rank(a) - rank(b) })

	var crds []Manifest
	established := false
	for _, m := range ordered {
		if rank(m) == 0 {
			crds = append(crds, m)
		} else if !established {
			if err := c.waitEstablished(ctx, crds, opts); err != nil {
				return err
			}
			established = true
		}
		if err := c.applyOne(ctx, m, opts); err != nil {
			return err
		}
	}
	if !established {
		return c.waitEstablished(ctx, crds, opts)
	}
	return nil
}

// applyOne applies one object, waiting while its resource is not served yet.
func (c *Client) applyOne(ctx context.Context, m Manifest, opts ApplyOptions) error {
	obj := m.Object
	what := fmt.Sprintf("%s %s", obj.GetKind(), obj.GetName())
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return fmt.Errorf("%s: %s: %w", m.Source, what, err)
	}
	deadline := time.Now().Add(opts.Timeout)
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		r, namespace, err := c.resourceFor(obj, opts.Namespace)
		if err == nil {
			if namespace != "" {
				what = fmt.Sprintf("%s %s/%s", obj.GetKind(), namespace, obj.GetName())
			}
			var before string
			if cur, gerr := r.Get(ctx, obj.GetName(), metav1.GetOptions{}); gerr == nil {
				before = cur.GetResourceVersion()
			}
			force := true
			var out *unstructured.Unstructured
			out, err = r.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: opts.FieldManager, Force: &force})
			if err == nil {
				result := "configured"
				switch before {
				case "":
					result = "created"
				case out.GetResourceVersion():
					result = "unchanged"
				}
				opts.Progress(what, m.Source, result)
				return nil
			}
		}
		// A resource not served yet (its CRD is new): discovery or the server lag.
		notServed := meta.IsNoMatchError(err) || (apierrors.IsNotFound(err) && !namespaceMissing(err))
		if !notServed || time.Now().Add(delay).After(deadline) {
			return fmt.Errorf("%s: applying %s: %w", m.Source, what, err)
		}
		c.mapper.Reset()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// namespaceMissing tells an apply's 404 about a missing namespace from one about a
// resource not served yet (an apply creates a missing object).
func namespaceMissing(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return false
	}
	d := status.Status().Details
	return d != nil && d.Kind == "namespaces"
}

// resourceFor resolves an object's resource, and its namespace (the default one for
// a namespaced object without one; "" for a cluster-scoped object).
func (c *Client) resourceFor(obj *unstructured.Unstructured, defaultNamespace string) (dynamic.ResourceInterface, string, error) {
	gvk := obj.GroupVersionKind()
	mapping, err := c.restMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, "", err
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return c.dynamic.Resource(mapping.Resource), "", nil
	}
	ns := obj.GetNamespace()
	if ns == "" {
		ns = defaultNamespace
	}
	return c.dynamic.Resource(mapping.Resource).Namespace(ns), ns, nil
}

// waitEstablished waits until every CRD is Established.
func (c *Client) waitEstablished(ctx context.Context, crds []Manifest, opts ApplyOptions) error {
	if len(crds) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	for _, m := range crds {
		name := m.Object.GetName()
		for {
			crd, err := c.dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && crdEstablished(crd) {
				opts.Progress("CustomResourceDefinition "+name, m.Source, "established")
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: CustomResourceDefinition %s is not Established after %s (kubectl describe crd %s tells why)", m.Source, name, opts.Timeout, name)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	c.mapper.Reset() // the new kinds
	return nil
}

func crdEstablished(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}
