package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "g-generated", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refs := cm.OwnerReferences
	if cm.Data["a"] != "one" || len(refs) != 1 || refs[0].UID != gen.GetUID() || refs[0].Kind != "Generator" {
		t.Fatalf("ConfigMap data %v, owners %+v: want data a=one owned by the Generator", cm.Data, refs)
	}
	mergePatch(t, generators, ns, "g", `{"spec":{"data":{"a":"two","b":"three"}}}`)
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		cm, _ := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "g-generated", metav1.GetOptions{})
		return cm != nil && cm.Data["a"] == "two" && cm.Data["b"] == "three", fmt.Sprintf("ConfigMap not synced: %v", cm)
	})
	if err := env.Dynamic.Resource(generators).Namespace(ns).Delete(t.Context(), "g", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// kube-controller-manager's garbage collector rediscovers resources every 30 s:
	// on a fresh cluster it may not watch the Generator CRD yet.
	testcluster.Eventually(t, 75*time.Second, func() (bool, string) {
		_, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "g-generated", metav1.GetOptions{})
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
	cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "tenant-registry", metav1.GetOptions{})
	if err != nil || cm.Data[key] == "" {
		t.Fatalf("registry %v (err %v): want an entry %s", cm, err, key)
	}
	if err := env.Dynamic.Resource(tenants).Namespace(ns).Delete(t.Context(), "acme", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, tenants, ns, "acme")
	cm, err = env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "tenant-registry", metav1.GetOptions{})
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

var (
	monitors = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "monitors"}
	quotas   = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "quotas"}
	teams    = schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "teams"}
)

// examples/monitors.lua: the daemon follows the newest spec, reports while it runs,
// and stops with its Monitor.
func TestExampleMonitorDaemon(t *testing.T) {
	ns := env.Namespace(t)
	op := startExamples(t, ns)
	create(t, monitors, ns, "{apiVersion: examples.luaop.dev/v1, kind: Monitor, metadata: {name: m}, spec: {configmap: target, period: 0.2}}")
	waitField(t, monitors, ns, "m", "status.found", false)
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "target"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitField(t, monitors, ns, "m", "status.found", true)
	if err := env.Dynamic.Resource(monitors).Namespace(ns).Delete(t.Context(), "m", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, monitors, ns, "m")
	if !strings.Contains(op.Log.String(), "monitor stopped after") {
		t.Errorf("the daemon did not stop through its flag:\n%s", op.Log.String())
	}
}

// examples/quotas.lua: the timer reports the namespace's ConfigMap usage.
func TestExampleQuotaTimer(t *testing.T) {
	ns := env.Namespace(t)
	startExamples(t, ns)
	for _, name := range []string{"a", "b"} {
		if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	create(t, quotas, ns, "{apiVersion: examples.luaop.dev/v1, kind: Quota, metadata: {name: q}, spec: {maxConfigMaps: 1}}")
	// kube-root-ca.crt is published in every namespace by the controller manager,
	// so count what is there rather than assume.
	obj := waitField(t, quotas, ns, "q", "status.usage.over", true)
	used := obj.Object["status"].(map[string]any)["usage"].(map[string]any)["used"].(int64)
	list, _ := env.Kube.CoreV1().ConfigMaps(ns).List(t.Context(), metav1.ListOptions{})
	if used < 2 || used > int64(len(list.Items)) {
		t.Errorf("usage.used = %d, the namespace has %d ConfigMaps", used, len(list.Items))
	}
}

// examples/teams.lua: a Team lists the Tenants indexed under its name.
func TestExampleTeamIndex(t *testing.T) {
	ns := env.Namespace(t)
	for _, tenant := range []string{"zeta", "alpha"} {
		create(t, tenants, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Tenant, metadata: {name: %s}, spec: {registry: %s, team: core}}", tenant, ns))
	}
	create(t, tenants, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Tenant, metadata: {name: other}, spec: {registry: %s, team: web}}", ns))
	startExamples(t, ns)
	create(t, teams, ns, "{apiVersion: examples.luaop.dev/v1, kind: Team, metadata: {name: core}}")
	waitField(t, teams, ns, "core", "status.roster.members", []any{"alpha", "zeta"})
	create(t, teams, ns, "{apiVersion: examples.luaop.dev/v1, kind: Team, metadata: {name: empty}}")
	waitField(t, teams, ns, "empty", "status.roster.members", []any{})
}
