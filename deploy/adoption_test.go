package deploy_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What a platform team's review of deploy/ looks for: a NetworkPolicy admitting only
// luaop's ports, replicas spread over nodes, RBAC naming the webhook configurations
// and the Secret it may change, no example handlers in the image.
func TestDeploySecurityAndSpread(t *testing.T) {
	_, objs := render(t, kubectl(t), "examples")
	var np networkingv1.NetworkPolicy
	one(t, objs, "NetworkPolicy", "luaop", &np)
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "luaop" || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		t.Errorf("NetworkPolicy: selector %v, types %v; want luaop's pods, Ingress", np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
	}
	var ports []string
	for _, rule := range np.Spec.Ingress {
		if len(rule.From) > 0 {
			continue
		}
		for _, p := range rule.Ports {
			ports = append(ports, p.Port.String())
		}
	}
	slices.Sort(ports)
	if strings.Join(ports, ",") != "9443,health,metrics" {
		t.Errorf("NetworkPolicy admits ports %v; want health, metrics and 9443 (webhooks) only", ports)
	}

	var dep appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &dep)
	keys := map[string]bool{}
	for _, c := range dep.Spec.Template.Spec.TopologySpreadConstraints {
		if c.LabelSelector == nil || c.LabelSelector.MatchLabels["app.kubernetes.io/name"] != "luaop" || c.MaxSkew != 1 {
			t.Errorf("topology spread %+v: want maxSkew 1 over luaop's pods", c)
		}
		keys[c.TopologyKey] = true
	}
	if !keys["kubernetes.io/hostname"] || !keys["topology.kubernetes.io/zone"] {
		t.Errorf("topology spread over %v; want nodes and zones", keys)
	}

	// RBAC: webhook configurations and Secrets by name (create aside, which
	// Kubernetes cannot narrow); no status of ConfigMaps.
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range find(objs, kind, "") {
			var rules []rbacv1.PolicyRule
			raw, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range raw {
				var pr rbacv1.PolicyRule
				m := r.(map[string]any)
				for _, f := range []string{"apiGroups", "resources", "verbs", "resourceNames"} {
					vals, _, _ := unstructured.NestedStringSlice(m, f)
					switch f {
					case "resources":
						pr.Resources = vals
					case "verbs":
						pr.Verbs = vals
					case "resourceNames":
						pr.ResourceNames = vals
					}
				}
				rules = append(rules, pr)
			}
			for _, r := range rules {
				for _, res := range r.Resources {
					sensitive := res == "secrets" || strings.HasSuffix(res, "webhookconfigurations")
					if sensitive && len(r.ResourceNames) == 0 && !slices.Equal(r.Verbs, []string{"create"}) {
						t.Errorf("%s %s grants %v on every %s; want them by resourceNames", kind, o.GetName(), r.Verbs, res)
					}
					if res == "configmaps/status" {
						t.Errorf("%s %s grants configmaps/status, which does not exist", kind, o.GetName())
					}
				}
			}
		}
	}

	_, _, root := paths(t)
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Handlers reach /scripts only through the HANDLERS build argument, empty by
	// default (the image then has an empty /scripts: the Deployment mounts the
	// scripts' ConfigMap there); no COPY takes them from the build context.
	handlersArg := false
	for _, line := range strings.Split(string(dockerfile), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "COPY") && strings.Contains(line, "scripts") && !strings.Contains(line, "--from=build /out/scripts ") {
			t.Errorf("the image ships handlers (%s): it must have none by default", line)
		}
		if strings.HasPrefix(line, "ARG HANDLERS") {
			handlersArg = true
			if line != "ARG HANDLERS=" {
				t.Errorf("%s: the image must have no handler by default (ARG HANDLERS=)", line)
			}
		}
	}
	if !handlersArg {
		t.Error("the Dockerfile has no ARG HANDLERS=: what decides the handlers in /scripts?")
	}
}

// The cert-manager component: a CA issuer chain, the Service's certificate, its
// Secret mounted as the folder LUAOP_WEBHOOK_CERT_DIR names (no subPath).
func TestCertManagerComponent(t *testing.T) {
	objs := renderOverlay(t, "", "cert-manager")
	cert := one(t, objs, "Certificate", "luaop-webhook", nil)
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	var svc unstructured.Unstructured = one(t, objs, "Service", "luaop-webhook", nil)
	if want := svc.GetName() + "." + svc.GetNamespace() + ".svc"; !slices.Contains(dns, want) {
		t.Errorf("the certificate's dnsNames %v lack the Service's %s", dns, want)
	}
	secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	caIssuer := one(t, objs, "Issuer", issuer, nil)
	caSecret, _, _ := unstructured.NestedString(caIssuer.Object, "spec", "ca", "secretName")
	ca := one(t, objs, "Certificate", "luaop-webhook-ca", nil)
	if isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA"); !isCA || caSecret != "luaop-webhook-ca" {
		t.Errorf("the issuer %s signs with %q; want the CA certificate's Secret luaop-webhook-ca (isCA %v)", issuer, caSecret, isCA)
	}
	var dep appsv1.Deployment
	one(t, objs, "Deployment", "luaop", &dep)
	c := dep.Spec.Template.Spec.Containers[0]
	var dir string
	for _, e := range c.Env {
		if e.Name == "LUAOP_WEBHOOK_CERT_DIR" {
			dir = e.Value
		}
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath == dir && m.SubPath == "" {
			for _, v := range dep.Spec.Template.Spec.Volumes {
				if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == secret {
					mounted = true
				}
			}
		}
	}
	if dir == "" || !mounted {
		t.Errorf("LUAOP_WEBHOOK_CERT_DIR=%q is not the mount of the Secret %s (without subPath)", dir, secret)
	}
}
