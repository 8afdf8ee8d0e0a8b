package deploy_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// The operator reads its scripts ConfigMap through the API (--scripts-from-api):
// the examples grant get, list and watch on that one ConfigMap by name, and the
// ConfigMap the operator is told, the one mounted and the one granted are the
// same; so is the last good ConfigMap told and granted.
func TestScriptsConfigMapReadByName(t *testing.T) {
	_, objs := render(t, kubectl(t), "examples")
	checkScriptsAccess(t, objs, "luaop-scripts")
}

// kustomize renames a ConfigMap of the build where it is referenced: the volume,
// and the Roles' resourceNames (its built-in name references); base's
// kustomizeconfig.yaml adds the env SCRIPTS_CONFIGMAP_NAME, so that an overlay
// with a namePrefix or nameSuffix tells the operator the renamed ConfigMap too,
// and the RBAC still grants exactly what the operator reads.
func TestNamePrefixRenamesTheScriptsConfigMapEverywhere(t *testing.T) {
	deployDir, _, _ := paths(t)
	overlay := t.TempDir()
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: team-\nnameSuffix: -x\nresources:\n- " +
		relPath(t, overlay, filepath.Join(deployDir, "examples")) + "\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	_, objs := render(t, kubectl(t), overlay)
	checkScriptsAccess(t, objs, "team-luaop-scripts-x")
}

// checkScriptsAccess checks, in rendered objects, that the Deployment mounts the
// ConfigMap cm, tells the operator namespace/cm, and that a Role of its namespace
// bound to its ServiceAccount grants get, list and watch of cm alone, and one the
// get and update of the last good ConfigMap it is told.
func checkScriptsAccess(t *testing.T, objs []unstructured.Unstructured, cm string) {
	t.Helper()
	var d appsv1.Deployment
	for _, o := range find(objs, "Deployment", "") {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			t.Fatal(err)
		}
	}
	if len(find(objs, "ConfigMap", cm)) != 1 {
		t.Fatalf("no ConfigMap %s in the build", cm)
	}
	var mounted string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "scripts" && v.ConfigMap != nil {
			mounted = v.ConfigMap.Name
		}
	}
	if mounted != cm {
		t.Errorf("the volume scripts mounts the ConfigMap %q, want %s", mounted, cm)
	}
	if got := envAsKubeletSees(&d, "LUAOP_SCRIPTS_CONFIGMAP"); got != d.Namespace+"/"+cm {
		t.Errorf("the operator is told its scripts ConfigMap is %q, want %s/%s", got, d.Namespace, cm)
	}
	if got := envAsKubeletSees(&d, "LUAOP_SCRIPTS_FROM_API"); got != "" && got != "true" {
		t.Errorf("LUAOP_SCRIPTS_FROM_API=%s: the examples read the scripts through the API", got)
	}
	lastGood := envAsKubeletSees(&d, "LUAOP_LAST_GOOD_CONFIGMAP")
	var sa string
	if sa = d.Spec.Template.Spec.ServiceAccountName; sa == "" {
		t.Fatal("the Deployment names no ServiceAccount")
	}
	var reader, keeper string
	for _, o := range find(objs, "Role", "") {
		var r rbacv1.Role
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
			t.Fatal(err)
		}
		for _, rule := range r.Rules {
			if !slices.Contains(rule.Resources, "configmaps") || r.Namespace != d.Namespace {
				continue
			}
			switch {
			case slices.Equal(rule.ResourceNames, []string{cm}):
				reader = r.Name
				if !slices.Equal(rule.Verbs, []string{"get", "list", "watch"}) {
					t.Errorf("Role %s grants %v on the ConfigMap %s, want get, list, watch", r.Name, rule.Verbs, cm)
				}
			case slices.Contains(rule.ResourceNames, lastGood) && slices.Contains(rule.Verbs, "update"):
				keeper = r.Name
			case len(rule.ResourceNames) == 0 && (slices.Contains(rule.Verbs, "list") || slices.Contains(rule.Verbs, "watch")):
				t.Errorf("Role %s lists or watches every ConfigMap of %s: want the scripts ConfigMap by name", r.Name, d.Namespace)
			}
		}
	}
	if reader == "" {
		t.Fatalf("no Role of %s grants get, list, watch of the ConfigMap %s by name (luaop rbac --scripts-configmap)", d.Namespace, cm)
	}
	if lastGood == "" || keeper == "" {
		t.Errorf("the last good ConfigMap told (%q) is granted by no Role", lastGood)
	}
	for _, role := range []string{reader, keeper} {
		if !roleBound(t, objs, role, d.Namespace, sa) {
			t.Errorf("no RoleBinding binds the Role %s to the ServiceAccount %s/%s", role, d.Namespace, sa)
		}
	}
}

// roleBound tells whether a RoleBinding of ns binds the Role role to the
// ServiceAccount ns/sa.
func roleBound(t *testing.T, objs []unstructured.Unstructured, role, ns, sa string) bool {
	for _, o := range find(objs, "RoleBinding", "") {
		var b rbacv1.RoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
			t.Fatal(err)
		}
		if b.Namespace != ns || b.RoleRef.Kind != "Role" || b.RoleRef.Name != role {
			continue
		}
		for _, s := range b.Subjects {
			if s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == ns {
				return true
			}
		}
	}
	return false
}
