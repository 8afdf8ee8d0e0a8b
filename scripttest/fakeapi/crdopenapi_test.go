package fakeapi

import (
	"encoding/json"
	"path/filepath"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

// The server-side apply models the fake builds for a CRD are the ones the API
// server builds (apiextensions-apiserver's openapi builder, which the fake cannot
// link: it brings the server's storage and grpc into the luaop binary): each
// version's model and those of ObjectMeta and what it holds, equal as JSON. A
// change in a Kubernetes upgrade fails here.
func TestCRDModelsAreTheAPIServers(t *testing.T) {
	crds, err := ReadCRDs(filepath.Join("testdata", "machines.yaml"), filepath.Join("parity", "gadgets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range crds {
		server := map[string]*spec.Schema{}
		for _, v := range crd.Spec.Versions {
			s, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for name, model := range s.Components.Schemas {
				server[name] = model
			}
		}
		ours := metaModels()
		for _, v := range crd.Spec.Versions {
			model, err := crdVersionModel(crd, v)
			if err != nil {
				t.Fatal(err)
			}
			ours[common.EscapeJsonPointer(gvkToModelName(crd.Spec.Group, v.Name, crd.Spec.Names.Kind))] = model
		}
		for name, model := range ours {
			want, ok := server[name]
			if !ok {
				t.Errorf("%s: the fake's model %s is not one of the server's", crd.Name, name)
				continue
			}
			if w, g := asJSON(t, want), asJSON(t, model); w != g {
				t.Errorf("%s: model %s differs from the server's:\nserver: %s\n  fake: %s", crd.Name, name, w, g)
			}
		}
		if _, err := crdTypeConverter(crd); err != nil {
			t.Errorf("%s: %v", crd.Name, err)
		}
	}
}

func asJSON(t *testing.T, s *spec.Schema) string {
	t.Helper()
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
