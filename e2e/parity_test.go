package e2e

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/luaop/luaop/kubeclient"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/scripttest/fakeapi"
	"github.com/luaop/luaop/scripttest/fakeapi/parity"
	"github.com/luaop/luaop/testcluster"
)

// The fake API of luaop test answers as the API server does (issue 44): the same
// table of requests (typed decoding of built-in kinds, a CRD's schema, defaults,
// CEL rule and status subresource, merge, JSON and strategic patches,
// resourceVersion preconditions, server-side apply by two managers, finalizers)
// through a real API server and through the fake gives the same answers and
// objects. The real server's answers are also the golden file fakeapi's unit test
// holds the fake to offline (LUAOP_UPDATE_PARITY=1 writes it).
func TestFakeAPIParity(t *testing.T) {
	env.Require(t)
	root := testcluster.RepoRoot()
	crdFile := filepath.Join(root, "scripttest", "fakeapi", "parity", "gadgets.yaml")
	if err := env.InstallCRDs(t.Context(), crdFile); err != nil {
		t.Fatal(err)
	}
	ns := env.Namespace(t)
	real := parity.Run(t.Context(), func(manager string) luabind.Kube {
		c, err := kubeclient.New(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		c.FieldManager = manager
		return c
	}, ns)
	crds, err := fakeapi.ReadCRDs(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakeapi.New(fakeapi.Options{CRDs: crds})
	if err != nil {
		t.Fatal(err)
	}
	offline := parity.Run(t.Context(), func(manager string) luabind.Kube { return fake.As(manager) }, ns)
	realJSON, err := parity.Canonical(real, ns)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join(root, "scripttest", "fakeapi", "parity", "testdata", "answers.json")
	if os.Getenv("LUAOP_UPDATE_PARITY") == "1" {
		if err := os.WriteFile(golden, realJSON, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if d := parity.Diff(real, offline, parity.Show(ns)); d != "" {
		t.Errorf("the fake API answers otherwise than the API server (want: the server's):\n%s", d)
	}
	if want, err := os.ReadFile(golden); err != nil || string(want) != string(realJSON) {
		t.Errorf("the API server's answers differ from %s (%v): run this test with LUAOP_UPDATE_PARITY=1 and review the diff", golden, err)
	}
}
