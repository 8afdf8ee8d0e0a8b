// Tests of deploy/: the base (no scripts), the examples overlay (its copies of
// scripts/examples are in sync; the rendered manifests hold what the deployment needs:
// the scripts mounted as a folder, a locked-down pod, probes, sized resources,
// least-privilege RBAC covering every example CRD; the API server accepts them, in a
// server-side dry run against the test cluster), the my-scripts template (sub-folders
// as ConfigMap keys, loaded by luaop as they would be from the mount) and the
// ServiceMonitor component.
//
// Rendering uses kubectl kustomize: $LUAOP_KUBECTL, else the kubectl that
// localcluster/build.sh built (never building it here), else kubectl from PATH.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scriptsource"
)

const (
	namespace      = "luaop-system"
	serviceAccount = "luaop"
	scriptsMount   = "/scripts"
	scriptsCMName  = "luaop-scripts"
)

// paths of the deploy folder (the package folder) and of the examples it copies.
func paths(t *testing.T) (deployDir, examplesDir, repoRoot string) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(wd)
	return wd, filepath.Join(root, "scripts", "examples"), root
}

func cmdContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestScriptsInSync(t *testing.T) {
	deployDir, _, _ := paths(t)
	out, err := exec.CommandContext(cmdContext(t), "bash", filepath.Join(deployDir, "examples", "check-sync.sh")).CombinedOutput()
	if err != nil {
		t.Fatalf("deploy/examples/check-sync.sh: %v\n%s\nfix: run deploy/examples/sync-scripts.sh", err, out)
	}
}

// kubectl finds the kubectl that renders and applies the kustomization.
func kubectl(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("LUAOP_KUBECTL"); p != "" {
		return p
	}
	_, _, root := paths(t)
	cmd := exec.CommandContext(cmdContext(t), filepath.Join(root, "localcluster", "build.sh"))
	cmd.Env = append(os.Environ(), "LUAOP_NO_BUILD=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		p := filepath.Join(strings.TrimSpace(lines[len(lines)-1]), "kubectl")
		if st, statErr := os.Stat(p); statErr == nil && !st.IsDir() {
			return p
		}
	}
	if p, lookErr := exec.LookPath("kubectl"); lookErr == nil {
		t.Logf("using kubectl from PATH (%s): localcluster/build.sh has no kubectl built (%s)", p, strings.TrimSpace(stderr.String()))
		return p
	}
	msg := fmt.Sprintf("no kubectl to render deploy/ with: set LUAOP_KUBECTL, build the local binaries once with localcluster/build.sh, or run `make test` (localcluster/build.sh: %v: %s)",
		err, strings.TrimSpace(stderr.String()))
	if os.Getenv("LUAOP_TEST_NO_CLUSTER") == "1" {
		t.Skip(msg)
	}
	t.Fatal(msg)
	return ""
}

// render runs kubectl kustomize on a folder of deploy/ and returns the YAML and its
// objects.
func render(t *testing.T, kubectlPath, folder string) ([]byte, []unstructured.Unstructured) {
	t.Helper()
	deployDir, _, _ := paths(t)
	if !filepath.IsAbs(folder) {
		folder = filepath.Join(deployDir, folder)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(cmdContext(t), kubectlPath, "kustomize", folder)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", folder, err, stderr.String())
	}
	return out, decodeAll(t, out)
}

func decodeAll(t *testing.T, data []byte) []unstructured.Unstructured {
	t.Helper()
	var objs []unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding YAML: %v", err)
		}
		if len(m) > 0 {
			objs = append(objs, unstructured.Unstructured{Object: m})
		}
	}
}

// find returns the objects of a kind (and name, when not empty).
func find(objs []unstructured.Unstructured, kind, name string) []unstructured.Unstructured {
	var found []unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			found = append(found, o)
		}
	}
	return found
}

// one converts the single object of a kind and name into out.
func one(t *testing.T, objs []unstructured.Unstructured, kind, name string, out any) unstructured.Unstructured {
	t.Helper()
	found := find(objs, kind, name)
	if len(found) != 1 {
		t.Fatalf("want exactly one %s %q in the rendered manifests, got %d", kind, name, len(found))
	}
	if out != nil {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(found[0].Object, out); err != nil {
			t.Fatalf("%s %s: %v", kind, name, err)
		}
	}
	return found[0]
}

func TestDeploy(t *testing.T) {
	k := kubectl(t)
	yamlOut, objs := render(t, k, "examples")

	t.Run("Namespace", func(t *testing.T) {
		one(t, objs, "Namespace", namespace, nil)
		one(t, objs, "ServiceAccount", serviceAccount, nil)
		for _, o := range objs {
			switch o.GetKind() {
			case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding":
			default:
				if o.GetNamespace() != namespace {
					t.Errorf("%s %s is in namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), namespace)
				}
			}
		}
	})

	t.Run("ScriptsConfigMap", func(t *testing.T) { checkScriptsConfigMap(t, objs) })
	t.Run("Deployment", func(t *testing.T) { checkDeployment(t, objs) })
	t.Run("CRDs", func(t *testing.T) { checkCRDs(t, objs) })
	t.Run("RBAC", func(t *testing.T) { checkRBAC(t, objs) })
	t.Run("Availability", func(t *testing.T) { checkAvailability(t, objs) })
	t.Run("Webhook", func(t *testing.T) { checkWebhook(t, objs) })
	t.Run("ServerDryRun", func(t *testing.T) { serverDryRun(t, k, yamlOut) })
}

// scriptsConfigMap is the ConfigMap generated from the scripts (its name has a hash suffix).
func scriptsConfigMap(t *testing.T, objs []unstructured.Unstructured) corev1.ConfigMap {
	t.Helper()
	var found []corev1.ConfigMap
	for _, o := range find(objs, "ConfigMap", "") {
		if o.GetName() == scriptsCMName || strings.HasPrefix(o.GetName(), scriptsCMName+"-") {
			var cm corev1.ConfigMap
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cm); err != nil {
				t.Fatal(err)
			}
			found = append(found, cm)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one ConfigMap generated as %s, got %d", scriptsCMName, len(found))
	}
	return found[0]
}

func checkScriptsConfigMap(t *testing.T, objs []unstructured.Unstructured) {
	_, examples, _ := paths(t)
	cm := scriptsConfigMap(t, objs)
	luas, err := filepath.Glob(filepath.Join(examples, "*.lua"))
	if err != nil || len(luas) == 0 {
		t.Fatalf("no scripts in %s (%v)", examples, err)
	}
	var want []string
	for _, p := range luas {
		name := filepath.Base(p)
		want = append(want, name)
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := cm.Data[name]; !ok {
			t.Errorf("ConfigMap %s lacks %s of scripts/examples", cm.Name, name)
		} else if got != string(src) {
			t.Errorf("ConfigMap %s: %s differs from scripts/examples/%s", cm.Name, name, name)
		}
	}
	var got []string
	for key := range cm.Data {
		got = append(got, key)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ConfigMap %s has keys %v, want the scripts of scripts/examples %v", cm.Name, got, want)
	}
	if len(cm.BinaryData) > 0 {
		t.Errorf("ConfigMap %s has binaryData; the scripts are text", cm.Name)
	}
}

func checkDeployment(t *testing.T, objs []unstructured.Unstructured) {
	var d appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &d)
	cm := scriptsConfigMap(t, objs)
	spec := d.Spec.Template.Spec

	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas: want 2 (a leader and a standby), got %v", d.Spec.Replicas)
	}
	if !hasEnv(&d, "LUAOP_LEADER_ELECT", "true") {
		t.Errorf("several replicas need leader election (LUAOP_LEADER_ELECT=true)")
	}
	// The operator guards the ConfigMap mounted as /scripts and keeps the last good
	// scripts next to it (issue 21).
	if got := envAsKubeletSees(&d, "LUAOP_SCRIPTS_CONFIGMAP"); got != d.Namespace+"/"+cm.Name {
		t.Errorf("the operator is told its scripts ConfigMap is %q, want %s/%s (LUAOP_SCRIPTS_CONFIGMAP)", got, d.Namespace, cm.Name)
	}
	if spec.ServiceAccountName != serviceAccount {
		t.Errorf("serviceAccountName: want %q, got %q", serviceAccount, spec.ServiceAccountName)
	}
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds != 30 {
		t.Errorf("terminationGracePeriodSeconds: want 30, got %v", spec.TerminationGracePeriodSeconds)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(spec.Containers))
	}
	c := spec.Containers[0]
	if c.Image != "luaop:latest" || c.ImagePullPolicy != corev1.PullIfNotPresent {
		t.Errorf("image: want luaop:latest IfNotPresent, got %s %s", c.Image, c.ImagePullPolicy)
	}
	if !slices.Equal(c.Args, []string{"run", scriptsMount}) {
		t.Errorf("args: want [run %s], got %v", scriptsMount, c.Args)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "LUAOP_LOG_FORMAT" && e.Value == "json" }) {
		t.Errorf("env: want LUAOP_LOG_FORMAT=json, got %v", c.Env)
	}

	// The scripts: the whole generated ConfigMap as the folder /scripts, no subPath.
	var volume string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			volume = v.Name
			if len(v.ConfigMap.Items) > 0 {
				t.Errorf("volume %s lists items: new scripts would not appear; mount the whole ConfigMap", v.Name)
			}
		}
	}
	if volume == "" {
		t.Fatalf("no volume of the ConfigMap %s (volumes: %+v)", cm.Name, spec.Volumes)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.Name != volume && m.MountPath != scriptsMount {
			continue
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			t.Errorf("volume mount %s at %s uses subPath %q / subPathExpr %q: ConfigMap updates would never reach the pod", m.Name, m.MountPath, m.SubPath, m.SubPathExpr)
		}
		if m.Name == volume && m.MountPath == scriptsMount {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("the ConfigMap volume %s is not mounted at %s (mounts: %+v)", volume, scriptsMount, c.VolumeMounts)
	}

	// Security: non-root, read-only root, no escalation, no capabilities, seccomp.
	pod := spec.SecurityContext
	if pod == nil {
		pod = &corev1.PodSecurityContext{}
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the container has no securityContext")
	}
	if !boolOr(sc.RunAsNonRoot, pod.RunAsNonRoot) {
		t.Error("runAsNonRoot is not true")
	}
	if uid := int64Or(sc.RunAsUser, pod.RunAsUser); uid != 65532 {
		t.Errorf("runAsUser: want 65532, got %d", uid)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		t.Errorf("capabilities: want drop [ALL] and no add, got %+v", sc.Capabilities)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = pod.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile: want RuntimeDefault, got %+v", seccomp)
	}

	// Probes on the named health port.
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "health" && p.ContainerPort == 8080 }) {
		t.Errorf("ports: want health 8080, got %+v", c.Ports)
	}
	checkProbe(t, "liveness", c.LivenessProbe, "/healthz")
	checkProbe(t, "readiness", c.ReadinessProbe, "/readyz")

	for name, want := range map[string]struct {
		list corev1.ResourceList
		res  corev1.ResourceName
		q    string
	}{
		"requests.cpu":    {c.Resources.Requests, corev1.ResourceCPU, "100m"},
		"requests.memory": {c.Resources.Requests, corev1.ResourceMemory, "128Mi"},
		"limits.memory":   {c.Resources.Limits, corev1.ResourceMemory, "384Mi"},
	} {
		got, ok := want.list[want.res]
		if !ok || got.Cmp(resource.MustParse(want.q)) != 0 {
			t.Errorf("resources.%s: want %s, got %v", name, want.q, got.String())
		}
	}
	if _, limited := c.Resources.Limits[corev1.ResourceCPU]; limited {
		t.Errorf("resources.limits.cpu is set: throttling only delays handlers")
	}
	// GOMEMLIMIT: the Go GC's soft limit, from the container's memory limit.
	memLimit := false
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil &&
			e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" && e.ValueFrom.ResourceFieldRef.ContainerName == c.Name {
			memLimit = true
		}
	}
	if !memLimit {
		t.Errorf("env: want GOMEMLIMIT from the container's limits.memory (resourceFieldRef), got %+v", c.Env)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9090 }) {
		t.Errorf("ports: want metrics 9090 (luaop's default --metrics-address), got %+v", c.Ports)
	}
}

// checkAvailability: the namespace enforces the restricted Pod Security Standard, a
// PodDisruptionBudget lets a drain take one replica at a time, and a Service exposes
// the metrics port of the pods.
func checkAvailability(t *testing.T, objs []unstructured.Unstructured) {
	ns := one(t, objs, "Namespace", namespace, nil)
	for _, mode := range []string{"enforce", "warn", "audit"} {
		if got := ns.GetLabels()["pod-security.kubernetes.io/"+mode]; got != "restricted" {
			t.Errorf("namespace %s: pod-security.kubernetes.io/%s = %q, want restricted", namespace, mode, got)
		}
	}
	var d appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &d)
	podLabels := d.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if podLabels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	var pdb policyv1.PodDisruptionBudget
	one(t, objs, "PodDisruptionBudget", "luaop", &pdb)
	if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels) {
		t.Errorf("PodDisruptionBudget luaop selects %v, not the pods (labels %v)", pdb.Spec.Selector, podLabels)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget luaop: want maxUnavailable 1 (a drain never blocks on two replicas), got %+v", pdb.Spec)
	}
	var svc corev1.Service
	one(t, objs, "Service", "luaop-metrics", &svc)
	if !selects(svc.Spec.Selector) {
		t.Errorf("Service luaop-metrics selects %v, not the pods (labels %v)", svc.Spec.Selector, podLabels)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service luaop-metrics: want the port metrics to the pods' port metrics, got %+v", svc.Spec.Ports)
	}
}

// The base holds no example: no scripts, no CRD, no RBAC (those depend on the scripts).
func TestBaseHasNoExamples(t *testing.T) {
	_, objs := render(t, kubectl(t), "base")
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "Deployment", "PodDisruptionBudget", "Service", "NetworkPolicy":
		default:
			t.Errorf("the base renders %s %s; it should hold only what every deployment shares", o.GetKind(), o.GetName())
		}
	}
	checkAvailability(t, objs)
}

// The template for one's own scripts renders, and its ConfigMap, written out as the
// kubelet mounts it (one flat folder), loads in luaop with the module of a sub-folder
// (the key lib__greeting.lua read as lib/greeting.lua).
func TestMyScriptsOverlay(t *testing.T) {
	k := kubectl(t)
	yamlOut, objs := render(t, k, "my-scripts")
	cm := scriptsConfigMap(t, objs)
	var keys []string
	mount := t.TempDir()
	for k, v := range cm.Data {
		keys = append(keys, k)
		if err := os.WriteFile(filepath.Join(mount, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"hello.lua", "lib__greeting.lua"}) {
		t.Errorf("ConfigMap %s keys %v, want [hello.lua lib__greeting.lua]", cm.Name, keys)
	}
	scripts, err := scriptsource.ReadDir(mount)
	if err != nil {
		t.Fatal(err)
	}
	rt := luabind.New(luabind.Options{Shards: 1})
	defer rt.Close()
	report, err := rt.Load(t.Context(), scripts)
	if err != nil {
		t.Fatalf("loading the ConfigMap's scripts as luaop would from /scripts: %v", err)
	}
	if len(report.Handlers) != 1 || report.Handlers[0].ID != "hello" {
		t.Errorf("handlers %+v, want hello", report.Handlers)
	}
	var d appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &d)
	one(t, objs, "ClusterRole", "luaop", nil)
	checkAvailability(t, objs)
	t.Run("ServerDryRun", func(t *testing.T) { serverDryRun(t, k, yamlOut) })
}

// The ServiceMonitor component, added to an overlay, scrapes the metrics Service.
func TestServiceMonitorComponent(t *testing.T) {
	objs := renderOverlay(t, "", "servicemonitor")
	sm := one(t, objs, "ServiceMonitor", "luaop", nil)
	if sm.GetNamespace() != namespace {
		t.Errorf("ServiceMonitor in %q, want %q", sm.GetNamespace(), namespace)
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	var svc corev1.Service
	one(t, objs, "Service", "luaop-metrics", &svc)
	for k, v := range sel {
		if svc.Labels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the Service has %v", k, v, svc.Labels)
		}
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 || endpoints[0].(map[string]any)["port"] != svc.Spec.Ports[0].Name {
		t.Errorf("ServiceMonitor endpoints %v; want the Service's port %s", endpoints, svc.Spec.Ports[0].Name)
	}
}

func relPath(t *testing.T, from, to string) string {
	t.Helper()
	rel, err := filepath.Rel(from, to)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

// renderOverlay renders an overlay of deploy/examples, as a user writes one: with
// namespace (empty: the examples' own) and the components of deploy/components
// named.
func renderOverlay(t *testing.T, namespace string, components ...string) []unstructured.Unstructured {
	t.Helper()
	deployDir, _, _ := paths(t)
	overlay := t.TempDir()
	kustomization := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
	if namespace != "" {
		kustomization += "namespace: " + namespace + "\n"
	}
	kustomization += "resources:\n- " + relPath(t, overlay, filepath.Join(deployDir, "examples")) + "\n"
	if len(components) > 0 {
		kustomization += "components:\n"
		for _, c := range components {
			kustomization += "- " + relPath(t, overlay, filepath.Join(deployDir, "components", c)) + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	_, objs := render(t, kubectl(t), overlay)
	return objs
}

func checkProbe(t *testing.T, name string, p *corev1.Probe, path string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s probe: want an HTTP GET of %s, got %+v", name, path, p)
		return
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "health" {
		t.Errorf("%s probe: want %s on port health, got %s on %s", name, path, p.HTTPGet.Path, p.HTTPGet.Port.String())
	}
}

func boolOr(v, fallback *bool) bool {
	if v != nil {
		return *v
	}
	return fallback != nil && *fallback
}

func int64Or(v, fallback *int64) int64 {
	if v != nil {
		return *v
	}
	if fallback != nil {
		return *fallback
	}
	return -1
}

// exampleCRDs reads the CRDs of scripts/examples/crds, the source of deploy/crds.
func exampleCRDs(t *testing.T) []unstructured.Unstructured {
	t.Helper()
	_, examples, _ := paths(t)
	var files []string
	for _, pattern := range []string{"*.yaml", "*.yml"} {
		m, _ := filepath.Glob(filepath.Join(examples, "crds", pattern))
		files = append(files, m...)
	}
	var crds []unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crds = append(crds, find(decodeAll(t, data), "CustomResourceDefinition", "")...)
	}
	return crds
}

func checkCRDs(t *testing.T, objs []unstructured.Unstructured) {
	crds := exampleCRDs(t)
	if len(crds) == 0 {
		t.Fatal("no CRD in scripts/examples/crds")
	}
	for _, crd := range crds {
		if len(find(objs, "CustomResourceDefinition", crd.GetName())) != 1 {
			t.Errorf("CRD %s of scripts/examples/crds is not in the rendered manifests", crd.GetName())
		}
	}
}

// crdResources gives the API group and the resources (plural and, with the status
// subresource, plural/status) of a CRD.
func crdResources(crd unstructured.Unstructured) (string, []string) {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	resources := []string{plural}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		if vm, ok := v.(map[string]any); ok {
			if _, has, _ := unstructured.NestedFieldNoCopy(vm, "subresources", "status"); has {
				resources = append(resources, plural+"/status")
				break
			}
		}
	}
	return group, resources
}

// allowed tells the verbs rules grant on a resource of a group.
func allowed(rules []rbacv1.PolicyRule, group, res string) []string {
	var verbs []string
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) {
			verbs = append(verbs, r.Verbs...)
		}
	}
	return verbs
}

func requireVerbs(t *testing.T, where string, rules []rbacv1.PolicyRule, group, res string, want ...string) {
	t.Helper()
	got := allowed(rules, group, res)
	for _, v := range want {
		if !slices.Contains(got, v) {
			t.Errorf("%s: %q on %s (group %q) is not allowed (allowed: %v)", where, v, res, group, got)
		}
	}
}

func checkRBAC(t *testing.T, objs []unstructured.Unstructured) {
	var cr rbacv1.ClusterRole
	one(t, objs, "ClusterRole", "luaop", &cr)
	for _, r := range cr.Rules {
		for _, field := range [][]string{r.APIGroups, r.Resources, r.Verbs} {
			if slices.Contains(field, "*") {
				t.Errorf("ClusterRole luaop: the rule %+v uses a wildcard; name groups, resources and verbs", r)
			}
		}
	}
	for _, crd := range exampleCRDs(t) {
		group, resources := crdResources(crd)
		for _, res := range resources {
			if strings.HasSuffix(res, "/status") {
				requireVerbs(t, "ClusterRole luaop", cr.Rules, group, res, "patch")
			} else {
				requireVerbs(t, "ClusterRole luaop", cr.Rules, group, res, "get", "list", "watch", "patch")
			}
		}
	}
	// rbac.yaml is the output of `luaop rbac` (cmd/luaop's TestDeployRBACIsGenerated).
	requireVerbs(t, "ClusterRole luaop", cr.Rules, "", "configmaps", "get", "list", "create", "patch")
	requireVerbs(t, "ClusterRole luaop", cr.Rules, "", "events", "create", "patch")

	// Leases: namespaced Roles in the operator's namespace. Leader election and
	// peering read and renew theirs; the webhooks' reachability probe only creates one
	// (its admission webhook refuses it, so nothing is ever stored).
	var leaseRole string
	for _, o := range find(objs, "Role", "") {
		var r rbacv1.Role
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
			t.Fatal(err)
		}
		if len(allowed(r.Rules, "coordination.k8s.io", "leases")) == 0 {
			continue
		}
		switch r.Name {
		case "luaop-webhooks":
			requireVerbs(t, "Role "+r.Name, r.Rules, "coordination.k8s.io", "leases", "create")
		case "luaop-leader-election":
			leaseRole = r.Name
			fallthrough
		default:
			requireVerbs(t, "Role "+r.Name, r.Rules, "coordination.k8s.io", "leases", "get", "create", "update")
		}
	}
	if leaseRole == "" {
		t.Error("no Role luaop-leader-election grants coordination.k8s.io leases (leader election)")
	}

	bound := func(kind, roleKind, roleName string) {
		t.Helper()
		for _, o := range find(objs, kind, "") {
			var b rbacv1.RoleBinding // same fields as a ClusterRoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &b); err != nil {
				t.Fatal(err)
			}
			if b.RoleRef.Kind != roleKind || b.RoleRef.Name != roleName {
				continue
			}
			for _, s := range b.Subjects {
				if s.Kind == "ServiceAccount" && s.Name == serviceAccount && s.Namespace == namespace {
					return
				}
			}
		}
		t.Errorf("no %s binds the %s %s to the ServiceAccount %s/%s", kind, roleKind, roleName, namespace, serviceAccount)
	}
	bound("ClusterRoleBinding", "ClusterRole", "luaop")
	// The last good scripts: a Role in the operator's namespace, get and update of
	// that one ConfigMap, create of ConfigMaps (create cannot name its object).
	var lastGoodRole string
	for _, o := range find(objs, "Role", "") {
		var r rbacv1.Role
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
			t.Fatal(err)
		}
		for _, rule := range r.Rules {
			if slices.Contains(rule.ResourceNames, "luaop-scripts-last-good") && slices.Contains(rule.Resources, "configmaps") &&
				slices.Contains(rule.Verbs, "get") && slices.Contains(rule.Verbs, "update") && r.Namespace == namespace {
				lastGoodRole = r.Name
			}
		}
	}
	if lastGoodRole == "" {
		t.Error("no Role of the operator's namespace grants get and update of the ConfigMap luaop-scripts-last-good (luaop rbac --scripts-configmap luaop-scripts)")
	} else {
		bound("RoleBinding", "Role", lastGoodRole)
	}
	if leaseRole != "" {
		bound("RoleBinding", "Role", leaseRole)
	}
}

// serverDryRun applies the rendered manifests with a server-side dry run. The API
// server refuses a dry run of objects in a namespace that does not exist yet, so the
// namespace is created for real when missing, and deleted at the end.
func serverDryRun(t *testing.T, kubectlPath string, manifests []byte) {
	if os.Getenv("LUAOP_TEST_NO_CLUSTER") == "1" {
		t.Skip("LUAOP_TEST_NO_CLUSTER=1: skipping the server-side dry run of deploy/ (it needs a cluster)")
	}
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		t.Fatal("LUAOP_TEST_KUBECONFIG is not set: run the tests with `make test`, which starts a local control plane, " +
			"or set LUAOP_TEST_NO_CLUSTER=1 to skip the cluster parts")
	}
	ctx := cmdContext(t)
	run := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, kubectlPath, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// The namespace: wait out a deletion still running (an earlier test run), then
	// create it when missing.
	var phase string
	for {
		out, err := run("get", "namespace", namespace, "--ignore-not-found", "-o", "jsonpath={.status.phase}")
		if err != nil {
			t.Fatalf("kubectl get namespace %s: %v\n%s", namespace, err, out)
		}
		phase = strings.TrimSpace(out)
		if phase != string(corev1.NamespaceTerminating) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("namespace %s is still terminating", namespace)
		case <-time.After(time.Second):
		}
	}
	if phase == "" {
		if out, err := run("create", "namespace", namespace); err != nil {
			t.Fatalf("kubectl create namespace %s: %v\n%s", namespace, err, out)
		}
		t.Cleanup(func() {
			cmd := exec.Command(kubectlPath, "--kubeconfig", kubeconfig, "delete", "namespace", namespace, "--wait=false", "--ignore-not-found")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("deleting the namespace %s created by the test: %v\n%s", namespace, err, out)
			}
		})
	}

	file := filepath.Join(t.TempDir(), "deploy.yaml")
	if err := os.WriteFile(file, manifests, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run("apply", "--dry-run=server", "-f", file)
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server of deploy/: %v\n%s", err, out)
	}
	t.Logf("kubectl apply --dry-run=server:\n%s", out)
	if !strings.Contains(out, "deployment.apps/luaop") {
		t.Errorf("the dry run did not report the Deployment:\n%s", out)
	}
}

func hasEnv(d *appsv1.Deployment, name, value string) bool {
	for _, c := range d.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == name && e.Value == value {
				return true
			}
		}
	}
	return false
}

// envAsKubeletSees is the value the container gets for the variable name: the
// kubelet expands $(VAR) with the variables defined before it in the list, and
// resolves fieldRef metadata.namespace to the pod's namespace (the Deployment's).
// "" when the variable is not set.
func envAsKubeletSees(d *appsv1.Deployment, name string) string {
	for _, c := range d.Spec.Template.Spec.Containers {
		defined := map[string]string{}
		for _, e := range c.Env {
			value := e.Value
			if f := e.ValueFrom; f != nil && f.FieldRef != nil && f.FieldRef.FieldPath == "metadata.namespace" {
				value = d.Namespace
			}
			value = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(value, func(ref string) string {
				if v, ok := defined[ref[2:len(ref)-1]]; ok {
					return v
				}
				return ref // undefined (or defined later): the kubelet leaves it as it is
			})
			defined[e.Name] = value
			if e.Name == name {
				return value
			}
		}
	}
	return ""
}

// An overlay that moves the examples to another namespace (kustomize's namespace:)
// needs nothing else: the operator is told its scripts ConfigMap and webhook Service
// in the new namespace, the namespace keeps the restricted Pod Security labels, and
// the RBAC follows. The node suite (e2e/node) runs such an overlay for real.
func TestOverlayInAnotherNamespace(t *testing.T) {
	objs := renderOverlay(t, "team-a")
	var d appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &d)
	if d.Namespace != "team-a" {
		t.Fatalf("Deployment in %q, want team-a", d.Namespace)
	}
	for v, want := range map[string]string{"LUAOP_SCRIPTS_CONFIGMAP": "team-a/luaop-scripts", "LUAOP_WEBHOOK_SERVICE": "team-a/luaop-webhook"} {
		if got := envAsKubeletSees(&d, v); got != want {
			t.Errorf("%s is %q in the pod, want %q", v, got, want)
		}
	}
	ns := one(t, objs, "Namespace", "team-a", nil)
	if ns.GetLabels()["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace team-a labels %v: want the restricted Pod Security Standard enforced", ns.GetLabels())
	}
	if len(find(objs, "Namespace", namespace)) != 0 {
		t.Errorf("the overlay still creates %s", namespace)
	}
	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetNamespace() != "team-a" {
			t.Errorf("%s %s stays in %s", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		if k := o.GetKind(); k == "RoleBinding" || k == "ClusterRoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				if sub := s.(map[string]any); sub["kind"] == "ServiceAccount" && sub["namespace"] != "team-a" {
					t.Errorf("%s %s binds the ServiceAccount of %v", k, o.GetName(), sub["namespace"])
				}
			}
		}
	}
}

// checkWebhook: the admission webhooks of the examples are served through a Service
// that selects the operator's pods on the container's webhook port, the operator is
// told to use it, the readiness probe covers the webhook server (/readyz), and the
// ServiceAccount may write the webhook configurations and keep the certificate's
// Secret.
func checkWebhook(t *testing.T, objs []unstructured.Unstructured) {
	var svc corev1.Service
	one(t, objs, "Service", "luaop-webhook", &svc)
	var d appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &d)
	c := d.Spec.Template.Spec.Containers[0]
	port := -1
	for _, p := range c.Ports {
		if p.Name == "webhook" {
			port = int(p.ContainerPort)
		}
	}
	if port != 9443 || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "webhook" || svc.Spec.Ports[0].Port != 443 {
		t.Errorf("webhook port: container %d, Service %+v; want the Service's 443 on the container's port webhook (9443)", port, svc.Spec.Ports)
	}
	for k, v := range svc.Spec.Selector {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("the Service selects %s=%s, which the pods do not have", k, v)
		}
	}
	if !hasEnv(&d, "LUAOP_WEBHOOK_ADDRESS", ":9443") || envAsKubeletSees(&d, "LUAOP_WEBHOOK_SERVICE") != d.Namespace+"/luaop-webhook" {
		t.Error("the operator is not told to serve the webhooks through the Service (LUAOP_WEBHOOK_ADDRESS, LUAOP_WEBHOOK_SERVICE)")
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("no /readyz readiness probe: the Service would send reviews to pods whose webhook server is not up")
	}
	var cr rbacv1.ClusterRole
	one(t, objs, "ClusterRole", "luaop-webhooks", &cr)
	for _, res := range []string{"validatingwebhookconfigurations", "mutatingwebhookconfigurations"} {
		requireVerbs(t, "ClusterRole luaop-webhooks", cr.Rules, "admissionregistration.k8s.io", res, "get", "create", "update", "delete")
	}
	var role rbacv1.Role
	one(t, objs, "Role", "luaop-webhooks", &role)
	requireVerbs(t, "Role luaop-webhooks", role.Rules, "", "secrets", "get", "create")
}

// The sharding component, added to an overlay: three replicas sharing the objects
// (leader election off, sharding on) and the Role of the membership Leases.
func TestShardingComponent(t *testing.T) {
	objs := renderOverlay(t, "", "sharding")
	var d appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &d)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas %v, want 3", d.Spec.Replicas)
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("%s set twice", e.Name)
		}
		env[e.Name] = e.Value
	}
	if env["LUAOP_SHARD_ACROSS_REPLICAS"] != "true" || env["LUAOP_LEADER_ELECT"] != "false" {
		t.Errorf("sharding %q, leader election %q: want true and false", env["LUAOP_SHARD_ACROSS_REPLICAS"], env["LUAOP_LEADER_ELECT"])
	}
	role := one(t, objs, "Role", "luaop-sharding", nil)
	if role.GetNamespace() != namespace {
		t.Errorf("Role in %q, want %q", role.GetNamespace(), namespace)
	}
	one(t, objs, "RoleBinding", "luaop-sharding", nil)
}
