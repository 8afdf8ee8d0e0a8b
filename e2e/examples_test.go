package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

var (
	generators = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "generators"}
	tenants    = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "tenants"}
)

func startExamples(t *testing.T, ns string) *testcluster.RunningOperator {
	t.Helper()
	return startWith(t, ns, operator.Options{ScriptsDir: filepath.Join(testcluster.RepoRoot(), "scripts", "examples")})
}

// examples/generator.lua: a ConfigMap per Generator, owned by it, kept in sync, and
// garbage-collected with it.
func TestExampleGeneratorOwnsItsConfigMap(t *testing.T) {
	ns := env.Namespace(t)
	startExamples(t, ns)
	gen := create(t, generators, ns, "{apiVersion: examples.luaop.dev/v1, kind: Generator, metadata: {name: g}, spec: {data: {a: one}}}")
	waitField(t, generators, ns, "g", "status.configmap.configmap", "g-generated")
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(context.Background(), "g-generated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refs := cm.OwnerReferences
	if cm.Data["a"] != "one" || len(refs) != 1 || refs[0].UID != gen.GetUID() || refs[0].Kind != "Generator" {
		t.Fatalf("ConfigMap data %v, owners %+v: want data a=one owned by the Generator", cm.Data, refs)
	}
	mergePatch(t, generators, ns, "g", `{"spec":{"data":{"a":"two","b":"three"}}}`)
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		cm, _ := env.Kube.CoreV1().ConfigMaps(ns).Get(context.Background(), "g-generated", metav1.GetOptions{})
		return cm != nil && cm.Data["a"] == "two" && cm.Data["b"] == "three", fmt.Sprintf("ConfigMap not synced: %v", cm)
	})
	if err := env.Dynamic.Resource(generators).Namespace(ns).Delete(context.Background(), "g", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		_, err := env.Kube.CoreV1().ConfigMaps(ns).Get(context.Background(), "g-generated", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "the ConfigMap was not garbage-collected with its owner"
	})
}

// examples/tenants.lua: the delete handler cleans what owner references cannot.
func TestExampleTenantCleanupOnDelete(t *testing.T) {
	ns := env.Namespace(t)
	startExamples(t, ns)
	create(t, tenants, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Tenant, metadata: {name: acme}, spec: {registry: %s}}", ns))
	key := ns + ".acme"
	waitField(t, tenants, ns, "acme", "status.register.registered", key)
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(context.Background(), "tenant-registry", metav1.GetOptions{})
	if err != nil || cm.Data[key] == "" {
		t.Fatalf("registry %v (err %v): want an entry %s", cm, err, key)
	}
	if err := env.Dynamic.Resource(tenants).Namespace(ns).Delete(context.Background(), "acme", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, tenants, ns, "acme")
	cm, err = env.Kube.CoreV1().ConfigMaps(ns).Get(context.Background(), "tenant-registry", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, left := cm.Data[key]; left {
		t.Errorf("the registry still lists %s after the tenant's deletion: %v", key, cm.Data)
	}
}

// examples/widgets.lua: the field handler follows spec.size only.
func TestExampleWidgetSizeFieldHandler(t *testing.T) {
	ns := env.Namespace(t)
	startExamples(t, ns)
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 1, color: red}}")
	waitField(t, widgets, ns, "w", "status.size.to", int64(1))
	mergePatch(t, widgets, ns, "w", `{"spec":{"color":"green"}}`)
	mergePatch(t, widgets, ns, "w", `{"spec":{"size":4}}`)
	obj := waitField(t, widgets, ns, "w", "status.size.to", int64(4))
	st := obj.Object["status"].(map[string]any)
	if st["size"].(map[string]any)["from"] != int64(1) || st["resized"] != int64(1) {
		t.Errorf("status = %v: want size from 1 to 4 and resized once", st)
	}
}
