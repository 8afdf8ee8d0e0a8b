package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/viper"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/testcluster"
)

var applyTestCRD = testcluster.OpenCRDYAML("applytest.luaop.dev", "applytests", "applytest", "ApplyTest")

// `luaop dev --apply CRDS --apply OBJECTS DIR` on a cluster that does not know the
// CRD yet: the CRD is applied and Established before the objects of its kind, and the
// scripts handle them, with no kubectl.
func TestDevApplyCRDsThenObjects(t *testing.T) {
	env, _ := exampleCluster(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	// A CRD the cluster does not have: a left-over of an earlier run goes first.
	err := env.Dynamic.Resource(crds).Delete(ctx, "applytests.applytest.luaop.dev", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		_, err := env.Dynamic.Resource(crds).Get(ctx, "applytests.applytest.luaop.dev", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("the CRD of an earlier run is still there (%v)", err)
	})

	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("crds/applytest.yaml", applyTestCRD)
	write("objects/objects.yaml", fmt.Sprintf(`apiVersion: applytest.luaop.dev/v1
kind: ApplyTest
metadata: {name: first, namespace: %[1]s}
spec: {size: 1}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: applied, namespace: %[1]s}
data: {a: "1"}
`, ns))
	// Without a namespace: the one of -n, as kubectl apply -n would.
	write("objects/second.yaml", `{apiVersion: applytest.luaop.dev/v1, kind: ApplyTest, metadata: {name: second}, spec: {size: 2}}`)
	write("objects/ignored.txt", "not a manifest")
	write("scripts/applytest.lua", `local luaop = require("luaop")
luaop.on.create("applytest.luaop.dev/v1/applytests", function(ctx)
  return { size = ctx.spec.size }
end, { id = "seen" })
`)

	v := viper.New()
	cmd := newDevCommand(v)
	if err := cmd.ParseFlags([]string{"--kubeconfig", testKubeconfig(t), "-n", ns, "--post-events=false",
		"--apply", filepath.Join(dir, "crds"), "--apply", filepath.Join(dir, "objects")}); err != nil {
		t.Fatal(err)
	}
	s, err := loadSettings(cmd, v)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runOperator(runCtx, s, filepath.Join(dir, "scripts"), true) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("luaop dev ended with %v", err)
		}
	})

	tests := schema.GroupVersionResource{Group: "applytest.luaop.dev", Version: "v1", Resource: "applytests"}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		obj, err := env.Dynamic.Resource(tests).Namespace(ns).Get(ctx, "first", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		size, _, _ := unstructured.NestedInt64(obj.Object, "status", "seen", "size")
		return size == 1, fmt.Sprintf("status of the applied object: %v", obj.Object["status"])
	})
	if _, err := env.Dynamic.Resource(tests).Namespace(ns).Get(ctx, "second", metav1.GetOptions{}); err != nil {
		t.Errorf("the object without a namespace is not in the namespace of -n: %v", err)
	}
	cm, err := env.Dynamic.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace(ns).Get(ctx, "applied", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the ConfigMap of --apply: %v", err)
	}
	managers := map[string]string{}
	for _, f := range cm.GetManagedFields() {
		managers[f.Manager] = string(f.Operation)
	}
	if managers["luaop-apply"] != "Apply" {
		t.Errorf("ConfigMap applied: managed fields %v, want a server-side apply by luaop-apply", managers)
	}
}

// testKubeconfig is the test cluster's kubeconfig.
func testKubeconfig(t *testing.T) string {
	if k := os.Getenv("LUAOP_TEST_KUBECONFIG"); k != "" {
		return k
	}
	if k := os.Getenv("KUBECONFIG"); k != "" {
		return k
	}
	t.Skip("no LUAOP_TEST_KUBECONFIG")
	return ""
}

// --apply is refused with --dry-run, and when a path does not exist.
func TestDevApplySettings(t *testing.T) {
	for _, args := range [][]string{
		{"--apply", t.TempDir(), "--dry-run"},
		{"--apply", filepath.Join(t.TempDir(), "missing")},
	} {
		v := viper.New()
		cmd := newDevCommand(v)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		if _, err := loadSettings(cmd, v); err == nil {
			t.Errorf("luaop dev %v: no error", args)
		}
	}
}

// `make dev` with KUBECONFIG set builds and starts no control plane and needs no
// kubectl: luaop dev applies the example CRDs and objects and handles them.
func TestMakeDevUsesKubeconfigWithoutBuildingTheControlPlane(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make dev")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	env, root := exampleCluster(t)
	ns := env.Namespace(t)
	// The objects (without a namespace) go to the context's namespace: this test's.
	cfg, err := clientcmd.LoadFromFile(testKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.CurrentContext].Namespace = ns
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}

	var out testcluster.LogBuffer
	cmd := exec.Command("make", "-s", "dev")
	cmd.Dir = root
	// An empty cache where nothing may be built: any use of localcluster/ fails.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "LUAOP_NAMESPACES="+ns, "LUAOP_POST_EVENTS=false",
		"LUAOP_CACHE="+t.TempDir(), "LUAOP_NO_BUILD=1")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if t.Failed() {
			t.Logf("make dev:\n%s", out.String())
		}
		// The operator is gone: release its finalizers, or the namespace never goes.
		if out, err := runLuaop(t, "release", "--kubeconfig", kubeconfig, "-n", ns, filepath.Join(root, "scripts", "examples")); err != nil {
			t.Errorf("luaop release: %v\n%s", err, out)
		}
	})

	widgets := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}
	testcluster.Eventually(t, 3*time.Minute, func() (bool, string) {
		select {
		case err := <-exited:
			t.Fatalf("make dev ended (%v):\n%s", err, out.String())
		default:
		}
		w, err := env.Dynamic.Resource(widgets).Namespace(ns).Get(t.Context(), "my-widget", metav1.GetOptions{})
		if err != nil {
			return false, "the example Widget: " + err.Error()
		}
		_, handled, _ := unstructured.NestedMap(w.Object, "status", "greet")
		return handled, fmt.Sprintf("the example Widget is not handled: status %v", w.Object["status"])
	})
	if strings.Contains(out.String(), "[localcluster]") {
		t.Errorf("make dev with KUBECONFIG used localcluster/:\n%s", out.String())
	}
}
