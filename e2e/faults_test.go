package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/testcluster"
)

// countingScript logs one line per handler run ("RAN <id> <name>" and so on), so
// that a test counts runs exactly from the operator's log.
const countingScript = `
	local luaop = require("luaop")
	for _, id in ipairs({ "a", "b", "c" }) do
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.logger.info("RAN " .. id .. " " .. ctx.name .. " .")
			return "done"
		end, { id = id })
	end
	luaop.on.field("examples.luaop.dev/v1/widgets", "spec.size", function(ctx)
		ctx.logger.info("SIZED " .. ctx.name .. " " .. tostring(ctx.new) .. " .")
		return ctx.new
	end, { id = "sized" })
	luaop.on.delete("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("DELETED " .. ctx.name .. " .")
	end, { id = "gone" })
`

// A second writer patches the same objects as fast as it can while the operator
// handles them: the operator's finalizer patches (which test the resourceVersion)
// meet 409/422 conflicts, its status patches race the writer's. No handler is lost,
// none runs twice after its success, the latest spec is handled, and deletion
// releases every finalizer.
func TestConflictStormFromASecondWriter(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(countingScript)})
	const n = 8
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}

	// The second writer, three goroutines: for every object in turn, a merge patch of
	// an annotation and a full update from a read copy (itself refused with 409 when
	// someone wrote in between), until stopped.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var writes, conflicts atomic.Int64
	client := env.Dynamic.Resource(widgets).Namespace(ns)
	storm := func(w int) {
		for i := w; ctx.Err() == nil; i++ {
			name := names[i%n]
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"storm.e2e/tick-%d":"%d"}}}`, w, i)
			if _, err := client.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
				writes.Add(1)
			}
			obj, err := client.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			labels := obj.GetLabels()
			if labels == nil {
				labels = map[string]string{}
			}
			labels[fmt.Sprintf("storm-%d", w)] = fmt.Sprint(i)
			obj.SetLabels(labels)
			switch _, err := client.Update(ctx, obj, metav1.UpdateOptions{}); {
			case err == nil:
				writes.Add(1)
			case apierrors.IsConflict(err):
				conflicts.Add(1)
			}
		}
	}
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			storm(w)
		}()
	}
	stopWriter := func() { stop(); wg.Wait() }
	t.Cleanup(stopWriter)

	for _, name := range names {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s}, spec: {size: 1}}", name))
	}
	for _, name := range names {
		waitField(t, widgets, ns, name, "status.c", "done")
		waitField(t, widgets, ns, name, "status.sized", int64(1))
	}
	for _, name := range names {
		mergePatch(t, widgets, ns, name, `{"spec":{"size":2}}`)
	}
	for _, name := range names {
		waitField(t, widgets, ns, name, "status.sized", int64(2))
	}
	// Let the storm go on over the handled objects a while (counted in writes, not
	// time), so a re-run after success would have its chance to show.
	base := writes.Load()
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		return writes.Load() >= base+int64(10*n), fmt.Sprintf("waiting for the second writer's writes: %d", writes.Load()-base)
	})
	for _, name := range names {
		if err := client.Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("deleting %s: %v", name, err)
		}
	}
	for _, name := range names {
		testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
			_, err := client.Get(t.Context(), name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("waiting for %s to be gone (finalizer released): %v", name, err)
		})
	}
	stopWriter()
	t.Logf("second writer: %d writes, %d of its updates refused with 409", writes.Load(), conflicts.Load())

	logs := op.Log.String()
	for _, name := range names {
		for _, want := range []string{"RAN a " + name + " .", "RAN b " + name + " .", "RAN c " + name + " .",
			"SIZED " + name + " 1 .", "SIZED " + name + " 2 .", "DELETED " + name + " ."} {
			if got := strings.Count(logs, want); got != 1 {
				t.Errorf("%q logged %d times, want exactly once", want, got)
			}
		}
	}
}

// flakeCRD is a CRD of this file's own, deleted and re-created by a test (the
// shared CRDs must stay for the other tests running in parallel).
var flakeCRD = testcluster.OpenCRDYAML("faults.e2e.luaop.dev", "flakes", "flake", "Flake")

var flakes = schema.GroupVersionResource{Group: "faults.e2e.luaop.dev", Version: "v1", Resource: "flakes"}

func installFlakeCRD(t *testing.T) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "flakes.yaml")
	if err := os.WriteFile(path, []byte(flakeCRD), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := env.InstallCRDs(t.Context(), path); err != nil {
		t.Fatalf("installing the flakes CRD: %v", err)
	}
}

// The CRD is deleted while the operator runs (its objects, holding the finalizer,
// go through their delete handlers first) and created again: the operator does not
// stop, and objects created afterwards are handled.
func TestCRDDeletedAndRecreatedWhileRunning(t *testing.T) {
	ns := env.Namespace(t)
	installFlakeCRD(t)
	crds := env.Dynamic.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("faults.e2e.luaop.dev/v1/flakes", function(ctx)
			ctx.logger.info("MADE " .. ctx.name .. " " .. ctx.uid .. " .")
			return "done"
		end, { id = "made" })
		luaop.on.delete("faults.e2e.luaop.dev/v1/flakes", function(ctx)
			ctx.logger.info("UNMADE " .. ctx.name .. " " .. ctx.uid .. " .")
		end, { id = "unmade" })
	`)})
	first := create(t, flakes, ns, "{apiVersion: faults.e2e.luaop.dev/v1, kind: Flake, metadata: {name: f1}, spec: {n: 1}}")
	waitField(t, flakes, ns, "f1", "status.made", "done")

	if err := crds.Delete(t.Context(), "flakes.faults.e2e.luaop.dev", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the CRD: %v", err)
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		_, err := crds.Get(t.Context(), "flakes.faults.e2e.luaop.dev", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("waiting for the CRD to go (its objects' finalizers released): %v", err)
	})

	installFlakeCRD(t)
	t.Cleanup(func() {
		_ = crds.Delete(context.Background(), "flakes.faults.e2e.luaop.dev", metav1.DeleteOptions{})
	})
	again := create(t, flakes, ns, "{apiVersion: faults.e2e.luaop.dev/v1, kind: Flake, metadata: {name: f1}, spec: {n: 2}}")
	create(t, flakes, ns, "{apiVersion: faults.e2e.luaop.dev/v1, kind: Flake, metadata: {name: f2}, spec: {n: 1}}")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		for _, name := range []string{"f1", "f2"} {
			obj, err := env.Dynamic.Resource(flakes).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if made, _, _ := unstructured.NestedString(obj.Object, "status", "made"); made != "done" {
				return false, "waiting for " + name + " (created after the CRD came back) to be handled"
			}
		}
		return true, ""
	})
	if !op.Ready() {
		t.Errorf("the operator is not ready after the CRD came back")
	}
	// Delete them while the operator runs, so the CRD's cleanup is not blocked.
	for _, name := range []string{"f1", "f2"} {
		if err := env.Dynamic.Resource(flakes).Namespace(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		list, err := env.Dynamic.Resource(flakes).Namespace(ns).List(t.Context(), metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, fmt.Sprintf("waiting for the flakes to go: %v", err)
	})
	logs := op.Log.String()
	for _, want := range []string{
		`"MADE f1 ` + string(first.GetUID()) + " .", `"UNMADE f1 ` + string(first.GetUID()) + " .",
		`"MADE f1 ` + string(again.GetUID()) + " .", `"UNMADE f1 ` + string(again.GetUID()) + " .",
		`"MADE f2 `, `"UNMADE f2 `,
	} {
		if got := strings.Count(logs, want); got != 1 {
			t.Errorf("%q logged %d times, want exactly once", want, got)
		}
	}
}

// A namespace is deleted while its objects hold luaop's finalizer: the operator runs
// their delete handlers, once each, releases the finalizers, and the namespace goes.
func TestNamespaceDeletedWithFinalizedObjects(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(countingScript)})
	const n = 5
	for i := range n {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w%d}, spec: {size: 1}}", i))
	}
	for i := range n {
		obj := waitField(t, widgets, ns, fmt.Sprintf("w%d", i), "status.c", "done")
		if len(obj.GetFinalizers()) == 0 {
			t.Fatalf("w%d holds no finalizer; the test needs one", i)
		}
	}
	if err := env.Kube.CoreV1().Namespaces().Delete(t.Context(), ns, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the namespace: %v", err)
	}
	testcluster.Eventually(t, 120*time.Second, func() (bool, string) {
		got, err := env.Kube.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("waiting for the namespace to go: %s, conditions %v", got.Status.Phase, got.Status.Conditions)
	})
	logs := op.Log.String()
	for i := range n {
		if want, got := fmt.Sprintf("DELETED w%d .", i), strings.Count(logs, fmt.Sprintf("DELETED w%d .", i)); got != 1 {
			t.Errorf("%q logged %d times, want exactly once", want, got)
		}
	}
}

// limitedOperatorEnv gives a ServiceAccount of ns (impersonated by the test's admin
// connection) what `luaop rbac` would for widgets alone: it may read the CRDs and
// list, watch and patch widgets, but not create ConfigMaps nor read gadgets. It
// returns an Env whose operators run as that ServiceAccount, and a function that
// grants the rest (ConfigMaps, gadgets).
func limitedOperatorEnv(t *testing.T, ns string) (*testcluster.Env, func()) {
	t.Helper()
	const sa = "luaop-limited"
	ctx := t.Context()
	rbac := env.Kube.RbacV1()
	crdReader := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-crds"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"apiextensions.k8s.io"}, Resources: []string{"customresourcedefinitions"}, Verbs: []string{"get"}}},
	}
	if _, err := rbac.ClusterRoles().Create(ctx, crdReader, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-crds"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: crdReader.Name},
		Subjects:   subject,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rbac.ClusterRoleBindings().Delete(context.Background(), ns+"-crds", metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(context.Background(), ns+"-crds", metav1.DeleteOptions{})
	})
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"examples.luaop.dev"}, Resources: []string{"widgets"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{"examples.luaop.dev"}, Resources: []string{"widgets/status"}, Verbs: []string{"patch"}},
		},
	}
	if _, err := rbac.Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: sa},
		Subjects:   subject,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa}
	grant := func() {
		role.Rules = append(role.Rules,
			rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "get"}},
			rbacv1.PolicyRule{APIGroups: []string{"e2e.luaop.dev"}, Resources: []string{"gadgets"}, Verbs: []string{"get", "list", "watch", "patch"}})
		if _, err := rbac.Roles(ns).Update(t.Context(), role, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("granting the missing RBAC: %v", err)
		}
	}
	return &testcluster.Env{Config: cfg}, grant
}

// The operator's ServiceAccount may not create the ConfigMap a handler creates
// through luaop.kube, nor list the gadgets it watches: the handler's failure and the
// watch's are logged with the object or resource and "forbidden"; objects that need
// neither are handled meanwhile; once the RBAC is granted, without a restart, the
// failed handler succeeds (once) and the gadgets are handled.
func TestRBACForbiddenThenGranted(t *testing.T) {
	ns := env.Namespace(t)
	limited, grant := limitedOperatorEnv(t, ns)
	opts := operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
			if ctx.spec.child then
				local obj, err, reason = luaop.kube.create({ apiVersion = "v1", kind = "ConfigMap",
					metadata = { name = ctx.name .. "-child", namespace = ctx.namespace }, data = { x = "1" } })
				if obj == nil then
					ctx.logger.info("KUBE FAILED " .. ctx.name .. " " .. tostring(reason) .. ": " .. tostring(err))
					error(luaop.temporary_error("creating the child: " .. tostring(err), 1))
				end
			end
			ctx.logger.info("MADE " .. ctx.name .. " .")
			return "done"
		end, { id = "made" })
		luaop.on.create("e2e.luaop.dev/v1/gadgets", function(ctx)
			ctx.logger.info("GADGET " .. ctx.name .. " .")
			return "done"
		end, { id = "gadget" })
	`)}
	opts.Processing.ConsistencyTimeout = 5 * time.Second
	op := limited.StartOperatorAsync(t, ns, opts)

	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: parent}, spec: {child: true}}")
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: plain}, spec: {child: false}}")
	create(t, gadgets, ns, "{apiVersion: e2e.luaop.dev/v1, kind: Gadget, metadata: {name: g1}, spec: {n: 1}}")
	waitField(t, widgets, ns, "plain", "status.made", "done")
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		logs := op.Log.String()
		return strings.Contains(logs, "KUBE FAILED parent Forbidden") && strings.Contains(logs, "gadgets") && strings.Contains(logs, "forbidden"),
			"waiting for the forbidden luaop.kube call and the forbidden watch of gadgets to be logged"
	})
	if obj := get(t, widgets, ns, "parent"); obj.Object["status"] != nil {
		if made, _, _ := unstructured.NestedString(obj.Object, "status", "made"); made == "done" {
			t.Fatalf("the parent was handled although its child could not be created")
		}
	}

	grant()
	waitField(t, widgets, ns, "parent", "status.made", "done")
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "parent-child", metav1.GetOptions{}); err != nil {
		t.Errorf("the child of the parent: %v", err)
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		obj, err := env.Dynamic.Resource(gadgets).Namespace(ns).Get(t.Context(), "g1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		made, _, _ := unstructured.NestedString(obj.Object, "status", "gadget")
		return made == "done", "waiting for the gadget to be handled once its RBAC is granted"
	})
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		return op.Ready(), "waiting for the operator to be ready once its RBAC is granted"
	})
	logs := op.Log.String()
	for _, want := range []string{`"MADE parent .`, `"MADE plain .`, `"GADGET g1 .`} {
		if got := strings.Count(logs, want); got != 1 {
			t.Errorf("%q logged %d times, want exactly once", want, got)
		}
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "KUBE FAILED parent") && !strings.Contains(line, "name=parent") {
			t.Errorf("the failed luaop.kube call is logged without its object: %s", line)
		}
	}
}

// writeKubeconfig writes the test cluster's connection as a kubeconfig file, for a
// `luaop run` subprocess.
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	if path := os.Getenv("LUAOP_TEST_KUBECONFIG"); path != "" {
		return path
	}
	c := env.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthority: c.CAFile, CertificateAuthorityData: c.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: c.BearerToken, TokenFile: c.BearerTokenFile,
		ClientCertificate: c.CertFile, ClientCertificateData: c.CertData, ClientKey: c.KeyFile, ClientKeyData: c.KeyData}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// buildLuaop builds the luaop command from the working tree into a temporary folder.
func buildLuaop(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "luaop")
	build := exec.Command("go", "build", "-o", bin, "./cmd/luaop")
	build.Dir = testcluster.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building luaop: %v\n%s", err, out)
	}
	return bin
}

// process is one `luaop run` subprocess, its log in a buffer.
type process struct {
	cmd *exec.Cmd
	log *testcluster.LogBuffer
}

func startLuaop(t *testing.T, bin, kubeconfig, ns, scripts string, flags ...string) *process {
	t.Helper()
	p := &process{log: &testcluster.LogBuffer{}}
	args := append([]string{"run", "--kubeconfig", kubeconfig, "--namespaces", ns,
		"--health-address=", "--metrics-address=", "--post-events=false", "--log-level", "info"}, flags...)
	p.cmd = exec.Command(bin, append(args, scripts)...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting luaop run: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the log of luaop run (pid %d):\n%s", p.cmd.Process.Pid, p.log.String())
		}
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

// kill9 kills the process with SIGKILL and waits for it.
func (p *process) kill9(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing luaop: %v", err)
	}
	_ = p.cmd.Wait()
}

// sigkillScript has three create handlers; b sleeps SLEEP seconds first.
const sigkillScript = `
	local luaop = require("luaop")
	luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("RAN a " .. ctx.name .. " .")
		return "done"
	end, { id = "a" })
	luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("STARTED b " .. ctx.name .. " .")
		luaop.sleep(SLEEP)
		ctx.logger.info("RAN b " .. ctx.name .. " .")
		return "done"
	end, { id = "b" })
	luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
		ctx.logger.info("RAN c " .. ctx.name .. " .")
		return "done"
	end, { id = "c" })
`

// The real `luaop run` is killed with SIGKILL twice: first while every object's
// handler b sleeps (mid-handler), then, with b quick and one worker, as soon as the
// first object is done while the others' handlers and patches are under way
// (mid-patch; where exactly the kill lands varies). A third run finishes.
// Every handler of every object succeeds in the end, and a handler whose success was
// stored on the object before a kill never runs again afterwards.
func TestSigkillMidHandlerAndMidPatch(t *testing.T) {
	ns := env.Namespace(t)
	bin := buildLuaop(t)
	kubeconfig := writeKubeconfig(t)
	dir := t.TempDir()
	writeScript := func(sleep string) {
		if err := os.WriteFile(filepath.Join(dir, "test.lua"), []byte(strings.ReplaceAll(sigkillScript, "SLEEP", sleep)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	const n = 30
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("w%d", i)
	}
	// stored is, per object, the handlers whose success is on the object now.
	stored := func() map[string]map[string]bool {
		got := map[string]map[string]bool{}
		for _, name := range names {
			obj := get(t, widgets, ns, name)
			got[name] = map[string]bool{}
			for _, id := range []string{"a", "b", "c"} {
				if v, _, _ := unstructured.NestedString(obj.Object, "status", id); v == "done" {
					got[name][id] = true
				}
			}
		}
		return got
	}
	// ranAfter fails the test for every handler run logged by p whose success was
	// stored before p started.
	ranAfter := func(p *process, before map[string]map[string]bool) {
		logs := p.log.String()
		for name, ids := range before {
			for id := range ids {
				if strings.Contains(logs, "RAN "+id+" "+name+" .") || strings.Contains(logs, "STARTED "+id+" "+name+" .") {
					t.Errorf("handler %s of %s ran again after its success was stored", id, name)
				}
			}
		}
	}

	writeScript("600")
	first := startLuaop(t, bin, kubeconfig, ns, dir, "--handler-timeout", "10m", "--workers", "64")
	for _, name := range names {
		create(t, widgets, ns, fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s}, spec: {size: 1}}", name))
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		logs := first.log.String()
		for _, name := range names {
			if !strings.Contains(logs, "STARTED b "+name+" .") {
				return false, "waiting for handler b of " + name + " to start sleeping"
			}
		}
		return true, ""
	})
	first.kill9(t)
	afterFirst := stored()
	t.Logf("killed mid-handler; stored: %v", afterFirst)
	for _, name := range names {
		if afterFirst[name]["b"] {
			t.Fatalf("handler b of %s is stored as done although it was killed in its sleep", name)
		}
	}

	writeScript("0")
	second := startLuaop(t, bin, kubeconfig, ns, dir, "--workers", "1")
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(second.log.String(), "RAN c "), "waiting for the second run to finish a first object"
	})
	second.kill9(t)
	ranAfter(second, afterFirst)
	afterSecond := stored()
	done := 0
	for _, name := range names {
		if afterSecond[name]["a"] && afterSecond[name]["b"] && afterSecond[name]["c"] {
			done++
		}
	}
	t.Logf("killed with %d of %d objects fully handled; stored: %v", done, n, afterSecond)

	third := startLuaop(t, bin, kubeconfig, ns, dir)
	for _, name := range names {
		waitField(t, widgets, ns, name, "status.c", "done")
		waitField(t, widgets, ns, name, "status.b", "done")
		waitField(t, widgets, ns, name, "status.a", "done")
	}
	ranAfter(third, afterSecond)
	// Objects all handled: no more runs come (checked once the third run is stopped).
	if err := third.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = third.cmd.Wait()
	all := first.log.String() + second.log.String() + third.log.String()
	for _, name := range names {
		for _, id := range []string{"a", "b", "c"} {
			if strings.Count(all, "RAN "+id+" "+name+" .") == 0 {
				t.Errorf("handler %s of %s never ran to its end", id, name)
			}
		}
	}
}

// A burst of updates of one object, from four writers each changing its own field:
// the final state is handled, and memory stays bounded: the heap of this process
// (operator and test) is sampled throughout; what it keeps once the burst is handled,
// and its peak, are bounded. The burst is the 10,000 updates (about 2.5
// minutes on a quiet 2-core machine), where keeping every update's body would break
// the bound on what is kept; LUAOP_TEST_BURST=1000 makes a quicker run by hand.
func TestBurstOfUpdatesOfOneObjectMemoryBounded(t *testing.T) {
	total := 10000
	if v := os.Getenv("LUAOP_TEST_BURST"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 4 {
			t.Fatalf("LUAOP_TEST_BURST=%q: want a whole number of updates, at least 4", v)
		}
		total = n
	}
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
		local luaop = require("luaop")
		luaop.on.update("examples.luaop.dev/v1/widgets", function(ctx)
			ctx.memo.runs = (ctx.memo.runs or 0) + 1
			local out = { runs = ctx.memo.runs }
			for k = 0, 3 do out["c" .. k] = ctx.spec["c" .. k] end
			return out
		end, { id = "upd" })
	`)})
	create(t, widgets, ns, "{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {"+
		"padding: '"+strings.Repeat("x", 2000)+"'}}")
	testcluster.Eventually(t, 15*time.Second, func() (bool, string) {
		_, ok := diffBaseOf(get(t, widgets, ns, "w"))
		return ok, "waiting for the creation to be handled (the diff-base stored)"
	})

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var peak atomic.Uint64
	sampling, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapAlloc > peak.Load() {
				peak.Store(m.HeapAlloc)
			}
			select {
			case <-sampling.Done():
				return
			case <-tick.C:
			}
		}
	}()

	const writers = 4
	each := total / writers
	client := env.Dynamic.Resource(widgets).Namespace(ns)
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for k := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= each; i++ {
				patch := fmt.Sprintf(`{"spec":{"c%d":%d}}`, k, i)
				if _, err := client.Patch(t.Context(), "w", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					errs <- fmt.Errorf("update %d of writer %d: %w", i, k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var obj *unstructured.Unstructured
	testcluster.Eventually(t, 120*time.Second, func() (bool, string) {
		obj = get(t, widgets, ns, "w")
		got, _, _ := unstructured.NestedMap(obj.Object, "status", "upd")
		for k := range writers {
			if v, ok := got[fmt.Sprintf("c%d", k)]; !ok || !sameValue(v, int64(each)) {
				return false, fmt.Sprintf("waiting for the last update to be handled: status.upd %v", got)
			}
		}
		return true, ""
	})
	stopSampling()
	<-sampled
	runtime.GC()
	runtime.ReadMemStats(&after)
	const mb = 1 << 20
	kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	grown := int64(peak.Load()) - int64(before.HeapAlloc)
	runs, _, _ := unstructured.NestedInt64(obj.Object, "status", "upd", "runs")
	t.Logf("%d updates handled in %d handler runs; heap before %d MiB, peak %d MiB, after %d MiB",
		writers*each, runs, before.HeapAlloc/mb, peak.Load()/mb, after.HeapAlloc/mb)
	// Keeping every update's body (2 kB of padding each, more as decoded JSON) would
	// keep more than 40 MiB; the bounds leave room for the test's own garbage.
	if kept > 32*mb {
		t.Errorf("the heap kept %d MiB more after the burst was handled, want under 32 MiB", kept/mb)
	}
	if grown > 512*mb {
		t.Errorf("the heap peaked %d MiB above its start during the burst, want under 512 MiB", grown/mb)
	}
	if logs := op.Log.String(); strings.Contains(logs, "level=ERROR") {
		t.Errorf("errors logged during the burst:\n%s", logs)
	}
}

// privateCluster starts a control plane of the test's own (localcluster/up.sh with
// its own state folder; stopped by down.sh when the test ends), for faults that would
// disturb the other tests sharing the package's cluster. It has the example CRDs.
func privateCluster(t *testing.T) (*testcluster.Env, string) {
	t.Helper()
	env.Require(t)
	root := testcluster.RepoRoot()
	dir, err := os.MkdirTemp("", "luaop-faults-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	script := func(name string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(root, "localcluster", name))
		cmd.Env = append(os.Environ(), "LUAOP_CLUSTER_DIR="+dir, "LUAOP_NO_BUILD=1")
		return cmd
	}
	t.Cleanup(func() {
		if out, err := script("down.sh").CombinedOutput(); err != nil {
			t.Logf("stopping the private control plane: %v\n%s", err, out)
		}
		_ = os.RemoveAll(dir)
	})
	up := script("up.sh")
	var stderr strings.Builder
	up.Stderr = &stderr
	out, err := up.Output()
	if err != nil {
		t.Fatalf("starting a private control plane: %v\n%s", err, stderr.String())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	private := &testcluster.Env{Config: cfg}
	if private.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if private.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := private.InstallCRDs(t.Context(), filepath.Join(root, "scripts", "examples", "crds")); err != nil {
		t.Fatalf("installing the CRDs on the private control plane: %v", err)
	}
	return private, dir
}

// restartComponent kills a process of the private control plane (SIGKILL: a crash,
// and no wait for a graceful shutdown of open watches), starts it again with the same
// command line (same ports, same data), and waits until it answers (etcd's /health)
// and kube-apiserver is ready (testcluster.RestartComponent). A restarted process that
// exits fails the test with the end of its log.
func restartComponent(t *testing.T, private *testcluster.Env, dir, name string) {
	t.Helper()
	took, err := testcluster.RestartComponent(t.Context(), dir, name, private.Kube)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s restarted: kube-apiserver ready %s after the new process started", name, took.Round(time.Millisecond))
}

// kube-apiserver, then etcd, is killed and started again while the operator runs
// (on a control plane of the test's own): objects handled before are not handled
// again, and a creation, an update and a deletion made after each restart are
// handled, each handler once.
func TestControlPlaneRestarts(t *testing.T) {
	private, dir := privateCluster(t)
	ns := private.Namespace(t)
	op := private.StartOperator(t, ns, operator.Options{Scripts: script(countingScript),
		Processing: processing.Options{ConsistencyTimeout: 5 * time.Second}})
	client := private.Dynamic.Resource(widgets).Namespace(ns)
	handled := func(name, field string, want any) {
		t.Helper()
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			obj, err := client.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got, found, _ := unstructured.NestedFieldNoCopy(obj.Object, splitPath(field)...)
			return found && sameValue(got, want), "waiting for " + name + " " + field + ": have " + show(got, found)
		})
	}
	createWidget := func(name string) {
		t.Helper()
		y := fmt.Sprintf("{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: %s}, spec: {size: 1}}", name)
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			_, err := client.Create(t.Context(), mustYAML(t, y), metav1.CreateOptions{})
			return err == nil, fmt.Sprintf("creating %s: %v", name, err)
		})
	}
	createWidget("w0")
	handled("w0", "status.c", "done")
	handled("w0", "status.sized", int64(1))
	want := []string{"RAN a w0 .", "RAN b w0 .", "RAN c w0 .", "SIZED w0 1 ."}
	// settled waits until the operator has the answer to its last patch of name: a
	// crash between kube-apiserver applying a patch and the operator reading the
	// answer (EOF) is the case of processing's TestAWriteWithoutAnswerDoesNotRunItsHandlerAgain
	// (the operator reads the object again before running anything); here the kill
	// must land where this test means it to.
	settled := func(name string) {
		t.Helper()
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			obj, err := client.Get(t.Context(), name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			rv := obj.GetResourceVersion()
			for _, line := range strings.Split(op.Log.String(), "\n") {
				if strings.Contains(line, "msg=patched ") && strings.Contains(line, " name="+name+" ") &&
					strings.Contains(line, " resourceVersion="+rv+" ") {
					return true, ""
				}
			}
			return false, fmt.Sprintf("waiting for the operator to log the answer to its patch of %s (resourceVersion %s)", name, rv)
		})
	}
	for i, component := range []string{"kube-apiserver", "etcd"} {
		prev, next := fmt.Sprintf("w%d", i), fmt.Sprintf("w%d", i+1)
		settled(prev)
		restartComponent(t, private, dir, component)
		createWidget(next)
		if _, err := client.Patch(t.Context(), prev, types.MergePatchType, []byte(`{"spec":{"size":2}}`), metav1.PatchOptions{}); err != nil {
			t.Fatalf("updating %s after restarting %s: %v", prev, component, err)
		}
		handled(next, "status.c", "done")
		handled(next, "status.sized", int64(1))
		handled(prev, "status.sized", int64(2))
		if err := client.Delete(t.Context(), prev, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
			_, err := client.Get(t.Context(), prev, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("waiting for %s to be gone after restarting %s: %v", prev, component, err)
		})
		want = append(want, "SIZED "+prev+" 2 .", "DELETED "+prev+" .",
			"RAN a "+next+" .", "RAN b "+next+" .", "RAN c "+next+" .", "SIZED "+next+" 1 .")
	}
	// A handler run again on a stale body would come after the consistency timeout:
	// the counts are taken once the last object is gone too (its delete handler is
	// the last thing that can happen to it).
	last := "w2"
	if err := client.Delete(t.Context(), last, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		_, err := client.Get(t.Context(), last, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("waiting for %s to be gone: %v", last, err)
	})
	want = append(want, "DELETED "+last+" .")
	logs := op.Log.String()
	for _, w := range want {
		if got := strings.Count(logs, w); got != 1 {
			t.Errorf("%q logged %d times, want exactly once", w, got)
		}
	}
}
