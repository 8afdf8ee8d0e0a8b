package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/testcluster"
)

func TestDryRunSetting(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  string
		want bool
	}{{nil, "", false}, {[]string{"--dry-run"}, "", true}, {nil, "true", true}} {
		if tt.env != "" {
			t.Setenv("LUAOP_DRY_RUN", tt.env)
		}
		v := viper.New()
		cmd := newDevCommand(v)
		cmd.Flags().String("config", "", "")
		if err := cmd.ParseFlags(tt.args); err != nil {
			t.Fatal(err)
		}
		s, err := loadSettings(cmd, v)
		if err != nil || s.DryRun != tt.want {
			t.Errorf("%v LUAOP_DRY_RUN=%q: DryRun = %v (%v), want %v", tt.args, tt.env, s.DryRun, err, tt.want)
		}
	}
}

// `luaop run --dry-run` against the real API server: the handlers run (the log shows
// the patch of their results and the luaop.kube writes they would have made), and
// nothing changes on the objects or anywhere else.
func TestRunDryRunWritesNothing(t *testing.T) {
	env, root := exampleCluster(t)
	ns := env.Namespace(t)
	docs, _ := testcluster.DecodeYAML(strings.NewReader(fmt.Sprintf(`{apiVersion: examples.luaop.dev/v1, kind: Widget, metadata: {name: w}, spec: {size: 2}}
---
{apiVersion: examples.luaop.dev/v1, kind: Tenant, metadata: {name: t}, spec: {team: a, registry: %s}}
---
{apiVersion: examples.luaop.dev/v1, kind: Generator, metadata: {name: g}, spec: {data: {k: v}}}`, ns)))
	widgets := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "widgets"}
	tenants := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "tenants"}
	generators := schema.GroupVersionResource{Group: "examples.luaop.dev", Version: "v1", Resource: "generators"}
	ctx := t.Context()
	w, err := env.Dynamic.Resource(widgets).Namespace(ns).Create(ctx, docs[0], metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tn, err := env.Dynamic.Resource(tenants).Namespace(ns).Create(ctx, docs[1], metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := env.Dynamic.Resource(generators).Namespace(ns).Create(ctx, docs[2], metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	logs := &testcluster.LogBuffer{}
	logOutput = logs
	t.Cleanup(func() { logOutput = os.Stderr })
	v := viper.New()
	cmd := newRunCommand(v)
	cmd.Flags().String("config", "", "")
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if err := cmd.ParseFlags([]string{"--kubeconfig", kubeconfig, "--namespaces", ns, "--health-address", "", "--metrics-address", "", "--dry-run", "--log-format", "plain"}); err != nil {
		t.Fatal(err)
	}
	s, err := loadSettings(cmd, v)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runOperator(runCtx, s, filepath.Join(root, "scripts", "examples"), false) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("luaop run --dry-run ended with %v", err)
			}
		}
	}
	t.Cleanup(stop)

	testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
		l := logs.String()
		for _, want := range []string{
			`dry run: not sent`, `\"greet\":{\"message\":\"hello from Lua\",\"size\":2}`, // the result patch
			`finalizers=`,               // the tenant's finalizer (its delete handler)
			`call=luaop.kube.apply`,     // generator.lua: its ConfigMap
			`\"name\":\"g-generated\"`,  // ... as it would have been applied
			`dry run: event not posted`, // the framework's Event of the handler outcome
		} {
			if !strings.Contains(l, want) {
				return false, "the log lacks " + want + ":\n" + l
			}
		}
		return true, ""
	})
	stop()

	for _, o := range []struct {
		gvr             schema.GroupVersionResource
		name, createdRV string
	}{{widgets, "w", w.GetResourceVersion()}, {tenants, "t", tn.GetResourceVersion()}, {generators, "g", g.GetResourceVersion()}} {
		got, err := env.Dynamic.Resource(o.gvr).Namespace(ns).Get(ctx, o.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.GetResourceVersion() != o.createdRV || len(got.GetFinalizers()) > 0 || len(got.GetAnnotations()) > 0 || got.Object["status"] != nil {
			t.Errorf("%s %s changed in a dry run: %v", o.gvr.Resource, o.name, got.Object)
		}
	}
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Get(ctx, "g-generated", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the generator's ConfigMap: %v, want NotFound (a dry run creates nothing)", err)
	}
	evs, err := env.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(evs.Items) > 0 {
		t.Errorf("events posted in a dry run: %v %v", err, evs)
	}
}
