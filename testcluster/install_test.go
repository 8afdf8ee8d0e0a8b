package testcluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// InstallCRDs returns once a CRD it just created is usable: discovery lists its
// resource and the first create of an object succeeds. (The server's warm-up, which
// InstallCRDs waits out with a dry-run create, holds that first create for about 2 s
// otherwise; how long a create takes is not asserted.)
func TestInstallCRDsMakesANewCRDUsable(t *testing.T) {
	e, err := Connect()
	if errors.Is(err, ErrNoCluster) {
		t.Skip("LUAOP_TEST_NO_CLUSTER=1: this test needs a cluster")
	}
	if err != nil {
		t.Fatal(err)
	}
	group := fmt.Sprintf("g%05d.install.luaop.dev", rand.IntN(100000))
	path := filepath.Join(t.TempDir(), "crd.yaml")
	crd := fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: probes.%[1]s}
spec:
  group: %[1]s
  scope: Namespaced
  names: {plural: probes, singular: probe, kind: Probe}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, group)
	if err := os.WriteFile(path, []byte(crd), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // t.Context() is already cancelled in cleanups
		_ = e.Dynamic.Resource(crdGVR).Delete(context.Background(), "probes."+group, metav1.DeleteOptions{})
	})
	if err := e.InstallCRDs(t.Context(), path); err != nil {
		t.Fatal(err)
	}
	served := false
	if list, err := e.Kube.Discovery().ServerResourcesForGroupVersion(group + "/v1"); err == nil {
		for _, r := range list.APIResources {
			served = served || r.Name == "probes"
		}
	}
	if !served {
		t.Errorf("right after InstallCRDs, discovery does not list %s/v1 probes", group)
	}
	probes := schema.GroupVersionResource{Group: group, Version: "v1", Resource: "probes"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1", "kind": "Probe", "metadata": map[string]any{"name": "first"}}}
	_, err = e.Dynamic.Resource(probes).Namespace("default").Create(t.Context(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the first create right after InstallCRDs: %v", err)
	}
}
