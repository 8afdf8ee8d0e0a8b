package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/luaop/luaop/testcluster"
)

// The rbac.yaml of each overlay of deploy/ is exactly what `luaop rbac` makes of its
// scripts, run from the overlay's folder as its kustomization.yaml says.
func TestDeployRBACIsGenerated(t *testing.T) {
	for _, tt := range []struct{ dir, scripts, fix string }{
		{".", "scripts/examples", "go run ./cmd/luaop rbac --leader-elect --scripts-configmap luaop-scripts scripts/examples > deploy/examples/rbac.yaml"},
		{"deploy/my-scripts", "scripts", "(cd deploy/my-scripts && go run ../../cmd/luaop rbac --leader-elect --scripts-configmap luaop-scripts scripts > rbac.yaml)"},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			t.Chdir(filepath.Join(testcluster.RepoRoot(), tt.dir))
			out, stderr, err := runCLI(t, "rbac", "--leader-elect", "--scripts-configmap", "luaop-scripts", tt.scripts)
			if err != nil {
				t.Fatal(err)
			}
			if stderr != "" {
				t.Errorf("warnings for %s: %s", tt.scripts, stderr)
			}
			file := filepath.Join(testcluster.RepoRoot(), "deploy", "examples", "rbac.yaml")
			if tt.dir != "." {
				file = "rbac.yaml"
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Errorf("%s drifted from the needs of %s; regenerate it from the repository's root:\n  %s\n%s",
					file, tt.scripts, tt.fix, lineDiff(string(want), out))
			}
		})
	}
}

// lineDiff shows the lines only one side has (-deploy/rbac.yaml +luaop rbac).
func lineDiff(want, got string) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	w, g := count(want), count(got)
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if g[l] == 0 {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if w[l] == 0 {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}

func TestRBACRulesAndWarnings(t *testing.T) {
	dir := t.TempDir()
	src := `local luaop = require("luaop")
local function child(ctx) return { apiVersion = "apps/v1", kind = "Deployment", metadata = {} } end
luaop.on.create("v1/cm", function(ctx)
  luaop.kube.apply(child(ctx))
  luaop.kube.delete("networking.k8s.io/v1", "Ingress", ctx.namespace, "x")
  luaop.kube.get("policy/v1", "PodDisruptionBudget", ctx.namespace, "x")
  luaop.kube.list(ctx.spec.apiVersion, ctx.spec.kind, ctx.namespace)
end)
luaop.timer("example.com/v1/Policy", function(ctx) end, { interval = 5 })
`
	if err := os.WriteFile(filepath.Join(dir, "a.lua"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runCLI(t, "rbac", "--namespaces", "team-a,team-b", "--service-account", "ops/op", "--standalone", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"- apiGroups: [\"\"]\n  resources: [configmaps]\n  verbs: [get, list, watch, patch]\n",
		"# Secure metrics (--metrics-secure, luaop run's default)",
		"- apiGroups: [apps]\n  resources: [deployments]\n  verbs: [create, patch]\n",
		"- apiGroups: [example.com]\n  resources: [policies]\n",
		"- apiGroups: [networking.k8s.io]\n  resources: [ingresses]\n  verbs: [delete]\n",
		"- apiGroups: [policy]\n  resources: [poddisruptionbudgets]\n  verbs: [get]\n",
		"kind: Role\nmetadata:\n  name: luaop\n  namespace: team-a\n",
		"kind: RoleBinding\nmetadata:\n  name: luaop\n  namespace: team-b\n",
		"- kind: ServiceAccount\n  name: op\n  namespace: ops\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks\n%s\n---\n%s", want, out)
		}
	}
	// ConfigMaps have no status subresource: a rule for it would grant nothing.
	if strings.Contains(out, "configmaps/status") {
		t.Errorf("output grants configmaps/status, which does not exist:\n%s", out)
	}
	// Only the reviews of secure metrics are cluster-wide (TokenReviews and
	// SubjectAccessReviews are cluster-scoped).
	for _, m := range regexp.MustCompile(`kind: ClusterRole(?:Binding)?\n(?:metadata:\n)?  name: (\S+)`).FindAllStringSubmatch(out, -1) {
		if m[1] != "luaop-metrics-auth" {
			t.Errorf("namespaced output has the cluster-wide %s:\n%s", m[1], out)
		}
	}
	if strings.Contains(out, "leases") {
		t.Errorf("namespaced output without --leader-elect and with --standalone has leases:\n%s", out)
	}
	if !strings.Contains(stderr, "warning: 1 luaop.kube call(s) whose apiVersion or kind is not a literal; grant their resources by hand:\n  a.lua:7: luaop.kube.list") {
		t.Errorf("stderr: %s", stderr)
	}
}

// Admission handlers are served, not watched: no rules for their resource, and a
// ClusterRole for the (cluster-scoped) webhook configurations, also with Roles.
func TestRBACAdmissionHandlers(t *testing.T) {
	dir := t.TempDir()
	src := `local luaop = require("luaop")
luaop.on.validate("example.com/v1/gizmos", function(ctx) end)
luaop.on.mutate("example.com/v1/gizmos", function(ctx) end)
`
	if err := os.WriteFile(filepath.Join(dir, "a.lua"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	// The reachability probe dry-runs a Lease in the operator's namespace: granted
	// with --standalone (no peering Role) and another --peering-namespace too.
	for _, args := range [][]string{nil, {"--standalone"}, {"--peering-namespace", "elsewhere"}} {
		out, _, err := runCLI(t, append(append([]string{"rbac", "--namespaces", "team-a", "--service-account", "ops/op"}, args...), dir)...)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "gizmos") {
			t.Errorf("admission handlers' resource granted as watched:\n%s", out)
		}
		for _, want := range []string{
			// Creates of any name (a create cannot be narrowed), the rest by name:
			// the handlers' two configurations and the probe's.
			"kind: ClusterRole\nmetadata:\n  name: luaop-webhooks\nrules:\n- apiGroups: [admissionregistration.k8s.io]\n  resources: [mutatingwebhookconfigurations, validatingwebhookconfigurations]\n  verbs: [create]\n- apiGroups: [admissionregistration.k8s.io]\n  resources: [validatingwebhookconfigurations]\n  resourceNames: [luaop.dev.validate, luaop.dev.probe]\n  verbs: [get, update, delete]\n- apiGroups: [admissionregistration.k8s.io]\n  resources: [mutatingwebhookconfigurations]\n  resourceNames: [luaop.dev.mutate]\n  verbs: [get, update, delete]\n",
			"kind: ClusterRoleBinding\nmetadata:\n  name: luaop-webhooks\n",
			// The webhook certificate's Secret by name only, updated by renewals; the
			// probe's Lease creates.
			"kind: Role\nmetadata:\n  name: luaop-webhooks\n  namespace: ops\nrules:\n- apiGroups: [\"\"]\n  resources: [secrets]\n  verbs: [create]\n- apiGroups: [\"\"]\n  resources: [secrets]\n  resourceNames: [luaop-webhook-tls]\n  verbs: [get, update]\n- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [create]\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("luaop rbac %v: output lacks\n%s\n---\n%s", args, want, out)
			}
		}
	}
	// A webhook Service in another namespace: its Secret there, the probe's Lease
	// creates still in the operator's namespace.
	out, _, err := runCLI(t, "rbac", "--namespaces", "team-a", "--service-account", "ops/op", "--webhook-service", "certs/hook", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kind: Role\nmetadata:\n  name: luaop-webhooks\n  namespace: certs\nrules:\n- apiGroups: [\"\"]\n  resources: [secrets]\n  verbs: [create]\n- apiGroups: [\"\"]\n  resources: [secrets]\n  resourceNames: [hook-tls]\n  verbs: [get, update]\n---\n",
		"kind: Role\nmetadata:\n  name: luaop-webhooks-probe\n  namespace: ops\nrules:\n- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [create]\n",
		"kind: RoleBinding\nmetadata:\n  name: luaop-webhooks-probe\n  namespace: ops\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("luaop rbac --webhook-service certs/hook: output lacks\n%s\n---\n%s", want, out)
		}
	}
}

// Peering (on unless --standalone) needs the Leases of its namespace: the
// operator's own and its peers', and creates there for the webhooks' probe.
func TestRBACPeeringRole(t *testing.T) {
	dir := oneHandlerFolder(t)
	for _, tc := range []struct {
		args []string
		ns   string
	}{
		{nil, "luaop-system"},
		{[]string{"--peering-namespace", "ops"}, "ops"},
	} {
		out := rbacOf(t, dir, tc.args...)
		for _, want := range []string{
			"kind: Role\nmetadata:\n  name: luaop-peering\n  namespace: " + tc.ns + "\nrules:\n- apiGroups: [coordination.k8s.io]\n  resources: [leases]\n  verbs: [get, list, watch, create, update, delete]\n",
			"kind: RoleBinding\nmetadata:\n  name: luaop-peering\n  namespace: " + tc.ns + "\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("luaop rbac %v lacks\n%s\n---\n%s", tc.args, want, out)
			}
		}
	}
	out, _, err := runCLI(t, "rbac", "--standalone", dir)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "peering") {
		t.Errorf("luaop rbac --standalone has the peering Role:\n%s", out)
	}
}

// oneHandlerFolder is a scripts folder of one create handler of ConfigMaps: enough
// for luaop rbac to render the operator's own Roles.
func oneHandlerFolder(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.lua"), []byte(`local luaop = require("luaop")
luaop.on.create("v1/cm", function(ctx) end)`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rbacOf is what luaop rbac prints with args for the folder dir (the test fails
// on an error).
func rbacOf(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, _, err := runCLI(t, append(append([]string{"rbac"}, args...), dir)...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
