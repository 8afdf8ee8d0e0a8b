package testcluster

import "fmt"

// OpenCRDYAML is the YAML of a namespaced CustomResourceDefinition of version v1 with
// a status subresource, whose spec and status keep any field: the shape the tests'
// own CRDs need (one a test may delete and re-create, one given to `luaop dev --apply`).
func OpenCRDYAML(group, plural, singular, kind string) string {
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[2]s.%[1]s
spec:
  group: %[1]s
  scope: Namespaced
  names: {plural: %[2]s, singular: %[3]s, kind: %[4]s}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, group, plural, singular, kind)
}
