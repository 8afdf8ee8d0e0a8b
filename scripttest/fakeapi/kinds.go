package fakeapi

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

// BuiltinGroups are the API groups of Kubernetes itself.
var BuiltinGroups = []string{"", "apps", "batch", "autoscaling", "policy", "networking.k8s.io", "rbac.authorization.k8s.io",
	"storage.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io", "scheduling.k8s.io", "node.k8s.io",
	"certificates.k8s.io", "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "flowcontrol.apiserver.k8s.io",
	"resource.k8s.io", "storagemigration.k8s.io", "internal.apiserver.k8s.io", "authentication.k8s.io", "authorization.k8s.io"}

// withStatus are the built-in resources ("group/plural") that have a status
// subresource; clusterScoped the built-in kinds that live outside namespaces.
var (
	withStatus = map[string]bool{
		"/pods": true, "/services": true, "/nodes": true, "/namespaces": true, "/persistentvolumes": true,
		"/persistentvolumeclaims": true, "/replicationcontrollers": true, "/resourcequotas": true,
		"apps/deployments": true, "apps/statefulsets": true, "apps/daemonsets": true, "apps/replicasets": true,
		"batch/jobs": true, "batch/cronjobs": true, "autoscaling/horizontalpodautoscalers": true,
		"policy/poddisruptionbudgets": true, "networking.k8s.io/ingresses": true, "networking.k8s.io/servicecidrs": true,
		"storage.k8s.io/volumeattachments": true, "certificates.k8s.io/certificatesigningrequests": true,
		"apiextensions.k8s.io/customresourcedefinitions": true, "apiregistration.k8s.io/apiservices": true,
		"flowcontrol.apiserver.k8s.io/flowschemas": true, "flowcontrol.apiserver.k8s.io/prioritylevelconfigurations": true,
		"admissionregistration.k8s.io/validatingadmissionpolicies": true, "resource.k8s.io/resourceclaims": true,
		"internal.apiserver.k8s.io/storageversions": true,
	}
	clusterScoped = map[string]bool{
		"/Namespace": true, "/Node": true, "/PersistentVolume": true, "/ComponentStatus": true,
		"rbac.authorization.k8s.io/ClusterRole": true, "rbac.authorization.k8s.io/ClusterRoleBinding": true,
		"storage.k8s.io/StorageClass": true, "storage.k8s.io/CSIDriver": true, "storage.k8s.io/CSINode": true,
		"storage.k8s.io/VolumeAttachment": true, "storage.k8s.io/VolumeAttributesClass": true,
		"scheduling.k8s.io/PriorityClass": true, "node.k8s.io/RuntimeClass": true,
		"networking.k8s.io/IngressClass": true, "networking.k8s.io/IPAddress": true, "networking.k8s.io/ServiceCIDR": true,
		"certificates.k8s.io/CertificateSigningRequest": true, "certificates.k8s.io/ClusterTrustBundle": true,
		"admissionregistration.k8s.io/ValidatingWebhookConfiguration": true, "admissionregistration.k8s.io/MutatingWebhookConfiguration": true,
		"admissionregistration.k8s.io/ValidatingAdmissionPolicy": true, "admissionregistration.k8s.io/ValidatingAdmissionPolicyBinding": true,
		"admissionregistration.k8s.io/MutatingAdmissionPolicy": true, "admissionregistration.k8s.io/MutatingAdmissionPolicyBinding": true,
		"apiextensions.k8s.io/CustomResourceDefinition": true, "apiregistration.k8s.io/APIService": true,
		"flowcontrol.apiserver.k8s.io/FlowSchema": true, "flowcontrol.apiserver.k8s.io/PriorityLevelConfiguration": true,
		"resource.k8s.io/DeviceClass": true, "resource.k8s.io/ResourceSlice": true,
		"authentication.k8s.io/TokenReview": true, "authorization.k8s.io/SubjectAccessReview": true,
		"authorization.k8s.io/SelfSubjectAccessReview": true, "authorization.k8s.io/SelfSubjectRulesReview": true,
	}
	// irregularPlurals are the built-in kinds whose resource Kubernetes' plural rule
	// does not give.
	irregularPlurals = map[string]string{"Endpoints": "endpoints"}
)

// IsBuiltinGroup tells whether group is one of Kubernetes' own.
func IsBuiltinGroup(group string) bool { return slices.Contains(BuiltinGroups, group) }

// HasStatusSubresource tells whether a built-in resource has a status subresource
// (configmaps, secrets or events have none: a rule for configmaps/status grants
// nothing, and a status written to one is dropped). A resource of another group is
// a custom resource: true, as most CRDs declare one (give the CRD to know).
func HasStatusSubresource(group, plural string) bool {
	if !IsBuiltinGroup(group) {
		return true
	}
	return withStatus[group+"/"+plural]
}

// PluralOf is the resource of a kind by Kubernetes' rules (Policy -> policies) and
// the irregular built-in plurals.
func PluralOf(gvk schema.GroupVersionKind) string {
	if p, ok := irregularPlurals[gvk.Kind]; ok && IsBuiltinGroup(gvk.Group) {
		return p
	}
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	return plural.Resource
}

// kind is what the server knows of one kind.
type kind struct {
	gvk        schema.GroupVersionKind
	plural     string
	namespaced bool
	status     bool // a status subresource: the main resource's writes keep the old status
	// builtin: a kind of client-go's scheme (typed decoding); crd: a custom
	// resource of a CRD given; neither: unknown, stored as given.
	builtin bool
	crd     *crdKind
}

func (k *kind) groupResource() schema.GroupResource {
	return schema.GroupResource{Group: k.gvk.Group, Resource: k.plural}
}

// kindOf is what the server knows of apiVersion and kind: a CRD given, a built-in
// kind, or an unknown kind (namespaced, stored as given).
func (s *Server) kindOf(apiVersion, kindName string) (*kind, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, fmt.Errorf("apiVersion %q: %w", apiVersion, err)
	}
	gvk := gv.WithKind(kindName)
	if k, ok := s.kinds[gvk]; ok {
		return k, nil
	}
	k := &kind{gvk: gvk, plural: PluralOf(gvk), namespaced: true}
	switch {
	case s.crdGroupKinds[gvk.GroupKind()]:
		return nil, fmt.Errorf("%s %s is not served by the cluster: no matches for kind %q in version %q (the CRD serves other versions)", apiVersion, kindName, kindName, apiVersion)
	case scheme.Scheme.Recognizes(gvk):
		k.builtin = true
		k.namespaced = !clusterScoped[gvk.Group+"/"+gvk.Kind]
		k.status = withStatus[gvk.Group+"/"+k.plural]
	}
	s.kinds[gvk] = k
	return k, nil
}

// ReadCRDs reads the CustomResourceDefinitions of files and folders (YAML, one or
// more documents each; a folder's *.yaml, *.yml and *.json files, sorted). Documents
// of other kinds are skipped; a CRD that does not decode is an error naming its file.
func ReadCRDs(paths ...string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("CRDs: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		for _, pat := range []string{"*.yaml", "*.yml", "*.json"} {
			m, _ := filepath.Glob(filepath.Join(p, pat))
			files = append(files, m...)
		}
	}
	sort.Strings(files)
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		crds, err := readCRDFile(f)
		if err != nil {
			return nil, err
		}
		out = append(out, crds...)
	}
	return out, nil
}

func readCRDFile(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("%s (document %d): %w", path, i, err)
		}
		if head.Kind != "CustomResourceDefinition" {
			continue
		}
		if head.APIVersion != "apiextensions.k8s.io/v1" {
			return nil, fmt.Errorf("%s (document %d): a CustomResourceDefinition of %s: use apiextensions.k8s.io/v1", path, i, head.APIVersion)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(doc, crd); err != nil {
			return nil, fmt.Errorf("%s (document %d): %w", path, i, err)
		}
		out = append(out, crd)
	}
}

// CRDStatusKeeps tells whether the CRD's schema for version keeps status.<field>
// (declared, or under x-kubernetes-preserve-unknown-fields), and whether the version
// has a status subresource; ok is false when the CRD does not serve that version.
func CRDStatusKeeps(crd *apiextensionsv1.CustomResourceDefinition, version, field string) (keeps, statusSubresource, ok bool) {
	for _, v := range crd.Spec.Versions {
		if v.Name != version {
			continue
		}
		statusSubresource = v.Subresources != nil && v.Subresources.Status != nil
		if crd.Spec.PreserveUnknownFields || v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			return true, statusSubresource, true
		}
		root := v.Schema.OpenAPIV3Schema
		if root.XPreserveUnknownFields != nil && *root.XPreserveUnknownFields {
			if _, declared := root.Properties["status"]; !declared {
				return true, statusSubresource, true
			}
		}
		st, declared := root.Properties["status"]
		if !declared {
			return false, statusSubresource, true
		}
		if _, declared := st.Properties[field]; declared {
			return true, statusSubresource, true
		}
		keeps = st.XPreserveUnknownFields != nil && *st.XPreserveUnknownFields ||
			st.AdditionalProperties != nil && (st.AdditionalProperties.Allows || st.AdditionalProperties.Schema != nil)
		return keeps, statusSubresource, true
	}
	return false, false, false
}

// CRDFor is the CRD of crds serving apiVersion and kind, or nil.
func CRDFor(crds []*apiextensionsv1.CustomResourceDefinition, apiVersion, kindName string) *apiextensionsv1.CustomResourceDefinition {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil
	}
	for _, c := range crds {
		if c.Spec.Group == gv.Group && (c.Spec.Names.Kind == kindName || c.Spec.Names.Plural == kindName || c.Spec.Names.Singular == kindName || slices.Contains(c.Spec.Names.ShortNames, kindName)) {
			return c
		}
	}
	return nil
}

// Namespaced tells whether objects of apiVersion and kind live in a namespace (a
// kind it does not know is namespaced, as most custom resources are).
func (s *Server) Namespaced(apiVersion, kindName string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, err := s.kindOf(apiVersion, kindName)
	return err != nil || k.namespaced
}
