package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/luaop/luaop/testcluster"
)

// rbacDocs decodes luaop rbac's output.
func rbacDocs(t *testing.T, out string) []*unstructured.Unstructured {
	t.Helper()
	docs, err := testcluster.DecodeYAML(strings.NewReader(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return docs
}

func findDoc(docs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, d := range docs {
		if d.GetKind() == kind && d.GetName() == name {
			return d
		}
	}
	return nil
}

// luaop rbac --shard-across-replicas adds the Role of the sharding Leases in the
// namespace of --shard-namespace (the ServiceAccount's by default), bound to the
// ServiceAccount, and leaves out the peering Role (luaop run turns peering off when
// it shards); nothing changes without it; refused with --leader-elect (as luaop
// run refuses the pair), --shard-namespace alone and --peering-namespace.
func TestRBACShardingRole(t *testing.T) {
	dir := oneHandlerFolder(t)
	for _, tc := range []struct {
		args []string
		ns   string
	}{
		{[]string{"--shard-across-replicas"}, "luaop-system"},
		{[]string{"--shard-across-replicas", "--shard-namespace", "shards", "--service-account", "ops/op", "--name", "op"}, "shards"},
	} {
		out := rbacOf(t, dir, tc.args...)
		header, _, _ := strings.Cut(out, "\napiVersion")
		if !strings.Contains(header, " --shard-across-replicas") || tc.ns == "shards" && !strings.Contains(header, " --shard-namespace shards") {
			t.Errorf("luaop rbac %v: the header does not give the flags:\n%s", tc.args, header)
		}
		docs := rbacDocs(t, out)
		name := "luaop-sharding"
		sa := rbacv1.Subject{Kind: "ServiceAccount", Name: "luaop", Namespace: "luaop-system"}
		if tc.ns == "shards" {
			name, sa = "op-sharding", rbacv1.Subject{Kind: "ServiceAccount", Name: "op", Namespace: "ops"}
		}
		var role rbacv1.Role
		var binding rbacv1.RoleBinding
		r, b := findDoc(docs, "Role", name), findDoc(docs, "RoleBinding", name)
		if r == nil || b == nil {
			t.Fatalf("luaop rbac %v: no Role and RoleBinding %s:\n%s", tc.args, name, out)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(r.Object, &role); err != nil {
			t.Fatal(err)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(b.Object, &binding); err != nil {
			t.Fatal(err)
		}
		want := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "list", "watch", "create", "update", "delete"}}}
		if role.Namespace != tc.ns || !reflect.DeepEqual(role.Rules, want) {
			t.Errorf("luaop rbac %v: Role %s in %q with %+v, want in %q with %+v", tc.args, name, role.Namespace, role.Rules, tc.ns, want)
		}
		if binding.Namespace != tc.ns || binding.RoleRef.Name != name || !reflect.DeepEqual(binding.Subjects, []rbacv1.Subject{sa}) {
			t.Errorf("luaop rbac %v: RoleBinding %+v", tc.args, binding)
		}
		if peering := strings.TrimSuffix(name, "sharding") + "peering"; findDoc(docs, "Role", peering) != nil || findDoc(docs, "RoleBinding", peering) != nil {
			t.Errorf("luaop rbac %v: the peering Role %s, though a sharded operator does not peer:\n%s", tc.args, peering, out)
		}
	}
	out := rbacOf(t, dir)
	if strings.Contains(out, "sharding") {
		t.Errorf("luaop rbac without --shard-across-replicas has the sharding Role:\n%s", out)
	}
	if findDoc(rbacDocs(t, out), "Role", "luaop-peering") == nil {
		t.Errorf("luaop rbac without --shard-across-replicas has no peering Role:\n%s", out)
	}
	for _, args := range [][]string{{"--shard-across-replicas", "--leader-elect"}, {"--shard-namespace", "x"}, {"--shard-across-replicas", "--peering-namespace", "x"}} {
		if _, _, err := runCLI(t, append(append([]string{"rbac"}, args...), dir)...); err == nil {
			t.Errorf("luaop rbac %v: no error", args)
		}
	}
}

// deploy/components/sharding's Role and RoleBinding are what luaop rbac
// --shard-across-replicas prints for the examples' Deployment.
func TestShardingComponentRBACIsGenerated(t *testing.T) {
	t.Chdir(testcluster.RepoRoot())
	out, _, err := runCLI(t, "rbac", "--shard-across-replicas", "--scripts-configmap", "luaop-scripts", "scripts/examples")
	if err != nil {
		t.Fatal(err)
	}
	generated := rbacDocs(t, out)
	file := filepath.Join("deploy", "components", "sharding", "role.yaml")
	component, err := testcluster.ReadYAML(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(component) != 2 {
		t.Errorf("%s has %d documents, want the Role and its RoleBinding", file, len(component))
	}
	for _, kind := range []string{"Role", "RoleBinding"} {
		got, want := findDoc(component, kind, "luaop-sharding"), findDoc(generated, kind, "luaop-sharding")
		switch {
		case want == nil:
			t.Fatalf("luaop rbac --shard-across-replicas printed no %s luaop-sharding:\n%s", kind, out)
		case got == nil:
			t.Errorf("%s has no %s luaop-sharding", file, kind)
		case !reflect.DeepEqual(got.Object, want.Object):
			t.Errorf("%s's %s differs from luaop rbac --shard-across-replicas's:\n%v\nwant\n%v", file, kind, got.Object, want.Object)
		}
	}
}

// The RBAC luaop rbac --shard-across-replicas prints is all a sharded operator
// needs, on the real API server: applied for a ServiceAccount (Roles in the
// served namespace, --standalone), luaop run --shard-across-replicas acting as
// it labels every object for itself and handles it (labelled: not the fallback
// of filtering after the watch). The same RBAC without the flag is not enough:
// the operator cannot write its membership Lease, and says so.
func TestRBACShardingSufficesOnTheAPIServer(t *testing.T) {
	env, _ := exampleCluster(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "widgets.lua"), []byte(`local luaop = require("luaop")
luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx) return true end, { id = "seen" })
`), 0o644); err != nil {
		t.Fatal(err)
	}
	sa := "sharded"
	common := []string{"rbac", "--namespaces", ns, "--service-account", ns + "/" + sa, "--standalone", "--metrics-auth=false"}

	// A kubeconfig that acts as the ServiceAccount.
	kc, err := clientcmd.LoadFromFile(testKubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":" + sa
	}
	asSA := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, asSA); err != nil {
		t.Fatal(err)
	}
	apply := func(args ...string) {
		t.Helper()
		out, stderr, err := runCLI(t, append(append(common, args...), dir)...)
		if err != nil {
			t.Fatalf("luaop rbac: %v\n%s", err, stderr)
		}
		for _, d := range rbacDocs(t, out) {
			switch d.GetKind() {
			case "Role":
				var r rbacv1.Role
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object, &r); err != nil {
					t.Fatal(err)
				}
				_, err = env.Kube.RbacV1().Roles(r.Namespace).Create(ctx, &r, metav1.CreateOptions{})
			case "RoleBinding":
				var b rbacv1.RoleBinding
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d.Object, &b); err != nil {
					t.Fatal(err)
				}
				_, err = env.Kube.RbacV1().RoleBindings(b.Namespace).Create(ctx, &b, metav1.CreateOptions{})
			default:
				t.Fatalf("luaop rbac --namespaces printed a %s", d.GetKind())
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	run := func(runCtx context.Context) error {
		var out bytes.Buffer
		root := newRootCommand()
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"run", "--kubeconfig", asSA, "-n", ns, "--shard-across-replicas", "--shard-namespace", ns,
			"--standalone", "--health-address", "", "--metrics-address", "", "--post-events=false", "-q", dir})
		if err := root.ExecuteContext(runCtx); err != nil {
			return fmt.Errorf("%w\n%s", err, out.String())
		}
		return nil
	}

	// Without the flag: the operator stops at once, naming the Lease.
	apply("--name", "unsharded")
	if err := run(ctx); err == nil || !strings.Contains(err.Error(), "membership Lease") {
		t.Errorf("a sharded operator with the RBAC of an unsharded one: %v, want it refused its membership Lease", err)
	}

	apply("--name", "sharded", "--shard-across-replicas")
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx) }()
	defer func() { cancel(); <-done }()
	widgets := env.Dynamic.Resource(schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	for i := range 3 {
		w := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
			"metadata": map[string]any{"name": fmt.Sprintf("w%d", i)}, "spec": map[string]any{"size": int64(1)}}}
		if _, err := widgets.Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testcluster.Eventually(t, 60*time.Second, func() (bool, string) {
		select {
		case err := <-done:
			done <- err // for the deferred wait
			t.Fatalf("luaop run --shard-across-replicas ended: %v", err)
		default:
		}
		list, err := widgets.List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, w := range list.Items {
			seen, _, _ := unstructured.NestedBool(w.Object, "status", "seen")
			if w.GetLabels()["luaop.dev/shard"] == "" || !seen {
				return false, fmt.Sprintf("%s: labels %v, status %v", w.GetName(), w.GetLabels(), w.Object["status"])
			}
		}
		return len(list.Items) == 3, fmt.Sprintf("%d widgets", len(list.Items))
	})
}
