package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/luaop/luaop/processing"
)

// luaop release refuses while the operator's leader Lease is held and renewed
// within its duration, naming the holder and the Deployment to scale down; an
// expired Lease, --force and --dry-run let it go on.
func TestReleaseRefusesWhileTheOperatorHoldsItsLease(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	lease := func(ns string, renewedAgo time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "luaop"},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To("luaop-7d9f8c6b5-x2x7k_0a1b2c3d"),
				LeaseDurationSeconds: ptr.To[int32](15),
				RenewTime:            &metav1.MicroTime{Time: now.Add(-renewedAgo)},
			},
		}
	}
	tests := []struct {
		name    string
		lease   *coordinationv1.Lease
		s       settings
		force   bool
		wantErr []string
		warn    string
	}{
		{"held, found in any namespace", lease("ops", 3*time.Second), settings{}, false,
			[]string{"Lease ops/luaop is held by luaop-7d9f8c6b5-x2x7k_0a1b2c3d", "kubectl -n ops scale deployment/luaop --replicas=0", "--force"}, ""},
		{"held, in the namespace given", lease("ops", 3*time.Second), settings{LeaderNamespace: "ops", LeaderName: "luaop"}, false,
			[]string{"held by luaop-7d9f8c6b5-x2x7k_0a1b2c3d"}, ""},
		{"expired", lease("ops", time.Minute), settings{}, false, nil, ""},
		{"another name", lease("ops", time.Second), settings{LeaderName: "other"}, false, nil, ""},
		{"--force", lease("ops", time.Second), settings{}, true, nil, "warning: the operator is running"},
		{"--dry-run", lease("ops", time.Second), settings{DryRun: true}, false, nil, "warning: the operator is running"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kc := kubefake.NewClientset(tt.lease)
			var warn bytes.Buffer
			err := checkOperatorStopped(t.Context(), kc, tt.s, tt.force, now, &warn)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if tt.wantErr != nil && err == nil {
				t.Fatal("released while the operator holds its Lease")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if !strings.Contains(warn.String(), tt.warn) {
				t.Errorf("warnings %q lack %q", warn.String(), tt.warn)
			}
		})
	}
}

// A patch refused as Forbidden says which RBAC release needs; a 422 Invalid is tried
// again only when the object changed meanwhile (its resourceVersion test failed),
// not when the patch itself is refused.
func TestReleaseObjectErrors(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	res := processing.ResolvedResource{GVR: gvr, Namespaced: true}
	obj := func(rv string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "example.com/v1", "kind": "Widget",
			"metadata": map[string]any{"name": "w", "namespace": "ns", "resourceVersion": rv, "finalizers": []any{"luaop.dev/finalizer"}},
		}}
	}
	invalid := apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "", schema.GroupResource{}, "", "testing value /metadata/resourceVersion failed", 0, false)
	tests := []struct {
		name        string
		patchErrs   []error // answers to the patches, in order (then success)
		changeAfter bool    // the object's version changes after the first patch
		want        string  // "" : released
		patches     int
	}{
		{"forbidden", []error{apierrors.NewForbidden(gvr.GroupResource(), "w", nil)}, false, "needs list and patch on widgets", 1},
		{"invalid, object unchanged", []error{invalid}, false, "trying again would not help", 1},
		{"invalid, object changed", []error{invalid}, true, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stored := obj("1")
			if tt.changeAfter {
				stored = obj("2")
			}
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "WidgetList"}, stored)
			patches := 0
			dyn.PrependReactor("patch", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
				patches++
				if patches <= len(tt.patchErrs) {
					return true, nil, tt.patchErrs[patches-1]
				}
				return true, obj("3"), nil
			})
			r := releaser{dyn: dyn, finalizer: "luaop.dev/finalizer", annotations: "luaop.dev/", statusField: "luaop_dev"}
			changed, err := r.releaseObject(t.Context(), res, obj("1"))
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("not released: %v", err)
			case tt.want == "" && changed == "":
				t.Error("nothing released")
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v; want one with %q", err, tt.want)
			}
			if patches != tt.patches {
				t.Errorf("%d patch(es) sent, want %d", patches, tt.patches)
			}
		})
	}
}

// On a real API server: a Widget is released when the operator's Lease has expired,
// and luaop release refuses while it is held (the uninstall story with an operator
// scaled down too late).
func TestReleaseChecksTheLeaseOnTheServer(t *testing.T) {
	env, root := exampleCluster(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	kubeconfig := testKubeconfig(t)
	widgets := env.Dynamic.Resource(schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "finalizers": []any{"luaop.dev/finalizer"}},
		"spec":     map[string]any{},
	}}
	if _, err := widgets.Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "luaop-" + ns}, Spec: coordinationv1.LeaseSpec{
		HolderIdentity: ptr.To("luaop-7d9f8c6b5-x2x7k_0a1b"), LeaseDurationSeconds: ptr.To[int32](3600), RenewTime: &now,
	}}
	leases := env.Kube.CoordinationV1().Leases(ns)
	if _, err := leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	args := []string{"release", "--kubeconfig", kubeconfig, "-n", ns, "--leader-election-name", "luaop-" + ns, "--resource", "examples.luaop.dev/v1/widgets"}
	out, err := runLuaop(t, args...)
	if err == nil || !strings.Contains(err.Error(), "held by luaop-7d9f8c6b5-x2x7k_0a1b") || !strings.Contains(err.Error(), "scale deployment/luaop --replicas=0") {
		t.Fatalf("release while the Lease is held: %v\n%s", err, out)
	}
	if got, err := widgets.Get(ctx, "w", metav1.GetOptions{}); err != nil || len(got.GetFinalizers()) != 1 {
		t.Fatalf("the finalizer was removed although release refused (%v)", err)
	}
	// Expired: renewed two hours ago.
	old := metav1.NewMicroTime(time.Now().Add(-2 * time.Hour))
	got, err := leases.Get(ctx, lease.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.RenewTime = &old
	if _, err := leases.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := runLuaop(t, args...); err != nil {
		t.Fatalf("release with an expired Lease: %v\n%s", err, out)
	}
	if got, err := widgets.Get(ctx, "w", metav1.GetOptions{}); err != nil || len(got.GetFinalizers()) != 0 {
		t.Errorf("the finalizer is still there (%v)", err)
	}
	_ = root
}

// luaop release refuses while a replica of the sharded operator's group holds
// its membership Lease (renewed within its duration), naming the group and the
// namespace; an expired Lease, another group and --force/--dry-run let it go on.
func TestReleaseRefusesWhileShardMembersRun(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	member := func(group string, renewedAgo time.Duration) *coordinationv1.Lease {
		return &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: group + "-member-luaop-7d9f8c6b5-x2x7k-0a1b", Labels: map[string]string{"luaop.dev/shard-group": group}},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("luaop-7d9f8c6b5-x2x7k-0a1b"), LeaseDurationSeconds: ptr.To[int32](15),
				RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}},
		}
	}
	for _, tt := range []struct {
		name     string
		lease    *coordinationv1.Lease
		warnOnly bool
		refused  bool
		warn     string
	}{
		{"held", member("luaop", 2*time.Second), false, true, ""},
		{"expired", member("luaop", time.Minute), false, false, ""},
		{"another group", member("other", time.Second), false, false, ""},
		{"--force or --dry-run", member("luaop", time.Second), true, false, "warning: the sharded operator is running"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var warn bytes.Buffer
			err := checkShardMembersStopped(t.Context(), kubefake.NewClientset(tt.lease), "luaop", tt.warnOnly, now, &warn)
			if tt.refused != (err != nil) {
				t.Fatalf("refused: %v, want %v", err, tt.refused)
			}
			if err != nil && (!strings.Contains(err.Error(), "shard group luaop") || !strings.Contains(err.Error(), "namespace ops") || !strings.Contains(err.Error(), "--force")) {
				t.Errorf("error %q does not name the group, the namespace and --force", err)
			}
			if !strings.Contains(warn.String(), tt.warn) {
				t.Errorf("warnings %q lack %q", warn.String(), tt.warn)
			}
		})
	}
}
