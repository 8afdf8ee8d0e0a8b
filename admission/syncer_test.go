package admission

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

func testSyncer(t *testing.T) (*Syncer, *fake.Clientset) {
	client := fake.NewClientset()
	disco := client.Discovery().(*fakediscovery.FakeDiscovery)
	disco.Resources = []*metav1.APIResourceList{{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{
		{Name: "widgets", SingularName: "widget", Kind: "Widget", Namespaced: true},
		{Name: "widgets/status", Kind: "Widget", Namespaced: true},
		{Name: "clusterthings", SingularName: "clusterthing", Kind: "ClusterThing"},
	}}}
	return &Syncer{Client: client, Discovery: disco, Prefix: "ops.example.com", CABundle: func() []byte { return []byte("CA") },
		Namespaces: []string{"team-a", "team-b"},
		ClientConfig: func(path string) admissionregistrationv1.WebhookClientConfig {
			u := "https://127.0.0.1:9443" + path
			return admissionregistrationv1.WebhookClientConfig{URL: &u}
		}}, client
}

func TestSyncWritesOneWebhookPerHandler(t *testing.T) {
	s, client := testSyncer(t)
	ctx := t.Context()
	handlers := []Handler{
		{ID: "check_Size", Kind: causes.KindValidate, Resource: causes.Resource{}, Source: "a.lua:3"},
		{ID: "defaults", Kind: causes.KindMutate, SideEffects: true, FailurePolicy: "Ignore", Operations: []string{"CREATE"}},
		{ID: "things", Kind: causes.KindValidate},
		{ID: "late", Kind: causes.KindValidate, Source: "b.lua:1"},
	}
	handlers[0].Resource.Group, handlers[0].Resource.Version, handlers[0].Resource.Resource = "example.com", "v1", "Widget"
	handlers[1].Resource = handlers[0].Resource
	handlers[1].Subresource = "status"
	handlers[2].Resource.Group, handlers[2].Resource.Version, handlers[2].Resource.Resource = "example.com", "v1", "clusterthings"
	handlers[3].Resource.Group, handlers[3].Resource.Version, handlers[3].Resource.Resource = "example.com", "v1", "gizmos"

	unresolved, err := s.Sync(ctx, handlers)
	if err != nil {
		t.Fatal(err)
	}
	if len(unresolved) != 1 || !strings.Contains(unresolved[0], "late (b.lua:1)") {
		t.Errorf("unresolved = %q, want the handler of a resource not served", unresolved)
	}
	vc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "ops.example.com.validate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(vc.Webhooks) != 2 || vc.Labels[ManagedByLabel] != "luaop" {
		t.Fatalf("validating webhooks: %+v", vc)
	}
	w := vc.Webhooks[0]
	rule := w.Rules[0]
	got := fmt.Sprint(w.Name, " ", *w.ClientConfig.URL, " ", string(w.ClientConfig.CABundle), " ", rule.APIGroups, rule.APIVersions, rule.Resources,
		rule.Operations, " ", *rule.Scope, " ", *w.FailurePolicy, " ", *w.SideEffects, " ", *w.TimeoutSeconds, " ", w.NamespaceSelector.MatchExpressions[0].Values)
	want := "check-size.validate.ops.example.com https://127.0.0.1:9443/fail/validate/check_Size CA [example.com] [v1] [widgets] [*] Namespaced Fail None 10 [team-a team-b]"
	if got != want {
		t.Errorf("webhook\n got %s\nwant %s", got, want)
	}
	if s := *vc.Webhooks[1].Rules[0].Scope; s != admissionregistrationv1.ClusterScope {
		t.Errorf("clusterthings scope %s", s)
	}
	mc, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "ops.example.com.mutate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := mc.Webhooks[0]
	got = fmt.Sprint(m.Rules[0].Resources, m.Rules[0].Operations, " ", *m.FailurePolicy, " ", *m.SideEffects, " ", *m.ReinvocationPolicy)
	if got != "[widgets/status] [CREATE] Ignore NoneOnDryRun Never" {
		t.Errorf("mutating webhook: %s", got)
	}
	if u := *m.ClientConfig.URL; u != "https://127.0.0.1:9443/ignore/mutate/defaults" {
		t.Errorf("mutating webhook's URL %s: want the failure policy in the path", u)
	}

	// The same handlers again: nothing written.
	client.ClearActions()
	if _, err := s.Sync(ctx, handlers); err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" {
			t.Errorf("an unchanged sync wrote: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}

	// No mutate handler left: its configuration is deleted; Remove deletes the rest.
	if _, err := s.Sync(ctx, handlers[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "ops.example.com.mutate", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("mutating configuration without handlers: %v", err)
	}
	if err := s.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx); err != nil {
		t.Errorf("a second Remove: %v", err)
	}
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "ops.example.com.validate", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after Remove: %v", err)
	}
}

func TestNamespaceSelector(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, "<nil>"},
		{[]string{"a", "!b"}, "[{kubernetes.io/metadata.name In [a]} {kubernetes.io/metadata.name NotIn [b]}]"},
		{[]string{"a", "team-*"}, "<nil>"},
	} {
		sel := namespaceSelector(tc.in)
		got := "<nil>"
		if sel != nil {
			got = fmt.Sprint(sel.MatchExpressions)
		}
		if got != tc.want {
			t.Errorf("%q: %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestSecretCertificatesShared(t *testing.T) {
	client := fake.NewClientset()
	ctx := t.Context()
	a, err := SecretCertificates(ctx, client, "ops", "hook-tls", []string{"hook.ops.svc"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := SecretCertificates(ctx, client, "ops", "hook-tls", []string{"hook.ops.svc"})
	if err != nil {
		t.Fatal(err)
	}
	if string(a.CABundle()) != string(b.CABundle()) {
		t.Error("two replicas got different CAs: their caBundles would fight")
	}
	leaf, _ := a.GetCertificate(nil)
	cert, err := x509.ParseCertificate(leaf.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(a.CABundle())
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "hook.ops.svc", Roots: pool}); err != nil {
		t.Errorf("the serving certificate does not verify for the Service's name: %v", err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: pool}); err != nil {
		t.Errorf("nor for loopback: %v", err)
	}
}

// A Go handler (a validator of the operator's own ConfigMap, say) is synced with
// the rules and selectors it gives: no discovery, no namespaceSelector of its own.
func TestSyncGoHandler(t *testing.T) {
	s, client := testSyncer(t)
	ctx := t.Context()
	scope := admissionregistrationv1.NamespacedScope
	h := Handler{ID: "scripts-configmap", Kind: causes.KindValidate, Timeout: 5e9,
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"CREATE", "UPDATE"},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}, Scope: &scope}}},
		ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "luaop"}},
		Admit:          func(context.Context, Request) (Response, error) { return Response{Allowed: true}, nil }}
	if _, err := s.Sync(ctx, []Handler{h}); err != nil {
		t.Fatal(err)
	}
	vc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "ops.example.com.validate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w := vc.Webhooks[0]
	got := fmt.Sprint(w.Name, " ", *w.ClientConfig.URL, " ", w.Rules[0].Resources, " ", *w.TimeoutSeconds, " ", w.ObjectSelector.MatchLabels, " ", len(w.NamespaceSelector.MatchExpressions))
	if want := "scripts-configmap.validate.ops.example.com https://127.0.0.1:9443/fail/validate/scripts-configmap [configmaps] 5 map[app.kubernetes.io/name:luaop] 0"; got != want {
		t.Errorf("webhook\n got %s\nwant %s", got, want)
	}
}

// A discovery that fails (the API server overloaded, an aggregated API down) says
// nothing about the resource: the handler's webhook stays as written, the other
// handlers are synced, the error is returned (the sync is retried), and the
// configuration is never deleted because of it. Only "not served" leaves it out.
func TestSyncKeepsWebhookWhenDiscoveryFails(t *testing.T) {
	widgets := causes.Resource{}
	widgets.Group, widgets.Version, widgets.Resource = "example.com", "v1", "widgets"
	for _, tc := range []struct {
		name      string
		handlers  []Handler
		wantHooks []string // the validating webhooks after the failing sync
	}{
		{name: "the only handler", handlers: []Handler{{ID: "size", Kind: causes.KindValidate, Resource: widgets}},
			wantHooks: []string{"size.validate.ops.example.com"}},
		{name: "a handler added meanwhile", handlers: []Handler{{ID: "size", Kind: causes.KindValidate, Resource: widgets},
			{ID: "cm", Kind: causes.KindValidate, Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"*"},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}}},
			wantHooks: []string{"size.validate.ops.example.com", "cm.validate.ops.example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, client := testSyncer(t)
			ctx := t.Context()
			if _, err := s.Sync(ctx, tc.handlers[:1]); err != nil {
				t.Fatal(err)
			}
			api := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
			before, err := api.Get(ctx, "ops.example.com.validate", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			disco := s.Discovery.(*fakediscovery.FakeDiscovery)
			disco.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewServiceUnavailable("etcd is busy")
			})
			unresolved, err := s.Sync(ctx, tc.handlers)
			if err == nil || !strings.Contains(err.Error(), "size") || !strings.Contains(err.Error(), "kept") {
				t.Errorf("err = %v, want the discovery failure of size (retried)", err)
			}
			if len(unresolved) != 0 {
				t.Errorf("unresolved = %q: a failing discovery is not a resource not served", unresolved)
			}
			after, err := api.Get(ctx, "ops.example.com.validate", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the configuration is gone after a failing discovery: %v", err)
			}
			var names []string
			for _, w := range after.Webhooks {
				names = append(names, w.Name)
			}
			if fmt.Sprint(names) != fmt.Sprint(tc.wantHooks) {
				t.Fatalf("webhooks %q, want %q", names, tc.wantHooks)
			}
			if !equality.Semantic.DeepEqual(after.Webhooks[0], before.Webhooks[0]) {
				t.Errorf("the kept webhook changed:\n%+v\n%+v", after.Webhooks[0], before.Webhooks[0])
			}
		})
	}
}

// The API server applies whole seconds of timeoutSeconds: the handler's deadline
// must be computed from that value, not from a fraction it never sees, so that
// luaop answers before the API server gives up.
func TestTimeoutWholeSeconds(t *testing.T) {
	widgets := causes.Resource{}
	widgets.Group, widgets.Version, widgets.Resource = "example.com", "v1", "widgets"
	for _, tc := range []struct {
		timeout      time.Duration
		wantSeconds  int32
		wantDeadline time.Duration
	}{
		{0, 10, 8 * time.Second},
		{2500 * time.Millisecond, 2, 1600 * time.Millisecond},
		{1900 * time.Millisecond, 1, 800 * time.Millisecond},
		{300 * time.Millisecond, 1, 800 * time.Millisecond},
		{30 * time.Second, 30, 24 * time.Second},
	} {
		s, client := testSyncer(t)
		h := Handler{ID: "size", Kind: causes.KindValidate, Resource: widgets, Timeout: tc.timeout}
		if _, err := s.Sync(t.Context(), []Handler{h}); err != nil {
			t.Fatal(err)
		}
		vc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), "ops.example.com.validate", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := *vc.Webhooks[0].TimeoutSeconds
		if got != tc.wantSeconds || h.deadline() != tc.wantDeadline {
			t.Errorf("timeout %s: timeoutSeconds %d, deadline %s; want %d, %s", tc.timeout, got, h.deadline(), tc.wantSeconds, tc.wantDeadline)
		}
		if h.deadline() >= time.Duration(got)*time.Second {
			t.Errorf("timeout %s: the handler's deadline %s is not before the API server's %ds", tc.timeout, h.deadline(), got)
		}
	}
}

func TestRegisterTimeoutRange(t *testing.T) {
	admit := func(context.Context, Request) (Response, error) { return Response{Allowed: true}, nil }
	for _, tc := range []struct {
		timeout time.Duration
		ok      bool
	}{{0, true}, {time.Second, true}, {2500 * time.Millisecond, true}, {30 * time.Second, true},
		{500 * time.Millisecond, false}, {31 * time.Second, false}, {-time.Second, false}} {
		err := NewServer(nil, nil).Register(Handler{ID: "h", Kind: causes.KindValidate, Timeout: tc.timeout, Admit: admit})
		if (err == nil) != tc.ok {
			t.Errorf("Register with Timeout %s: %v, want ok=%v", tc.timeout, err, tc.ok)
		} else if err != nil && !strings.Contains(err.Error(), "1 to 30 seconds") {
			t.Errorf("Register with Timeout %s: %v, want the accepted range named", tc.timeout, err)
		}
	}
}

// Handler ids become webhook names the API server accepts: DNS labels of
// [a-z0-9-], not starting or ending with '-', none empty, at most 63 characters.
func TestWebhookNameIsADNSName(t *testing.T) {
	long := strings.Repeat("x", 70)
	for _, tc := range []struct{ id, want string }{
		{"check_Size", "check-size.validate.p.example.com"},
		{"a..b", "a.b.validate.p.example.com"},
		{"a.-b", "a.b.validate.p.example.com"},
		{"a-.b", "a.b.validate.p.example.com"},
		{".a.", "a.validate.p.example.com"},
		{"--", "handler.validate.p.example.com"},
		{"ü.ö", "handler.validate.p.example.com"},
		{long, ""},
		{strings.Repeat("abcdefghi.", 20), ""},
	} {
		got := webhookName(Handler{ID: tc.id, Kind: causes.KindValidate}, "p.example.com", map[string]bool{})
		if tc.want != "" && got != tc.want {
			t.Errorf("id %q: %q, want %q", tc.id, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("id %q: %q is not a DNS name: %v", tc.id, got, errs)
		}
		for _, l := range strings.Split(got, ".") {
			if errs := validation.IsDNS1123Label(l); len(errs) > 0 {
				t.Errorf("id %q: %q has label %q: %v", tc.id, got, l, errs)
			}
		}
	}
	// Two long ids that differ only past the cut stay two names.
	taken := map[string]bool{}
	a := webhookName(Handler{ID: long + "a", Kind: causes.KindValidate}, "p", taken)
	b := webhookName(Handler{ID: long + "b", Kind: causes.KindValidate}, "p", taken)
	if a == b {
		t.Errorf("two ids, one name %q", a)
	}
}

// Replicas start together and each writes the handlers' configurations: the one
// whose create or update loses the race (AlreadyExists, Conflict) reads the
// winner's copy and compares again, instead of failing the sync (and retrying 10 s
// later, logged as an error). The fake API server has another replica write first.
func TestSyncRaceWithAnotherReplica(t *testing.T) {
	handlers := []Handler{{ID: "check", Kind: causes.KindValidate}, {ID: "defaults", Kind: causes.KindMutate}}
	for i := range handlers {
		handlers[i].Resource.Group, handlers[i].Resource.Version, handlers[i].Resource.Resource = "example.com", "v1", "widgets"
	}
	for _, verb := range []string{"create", "update"} {
		t.Run(verb, func(t *testing.T) {
			s, client := testSyncer(t)
			if verb == "update" {
				// An older scripts' configurations, to be updated by both replicas.
				old := []Handler{{ID: "old", Kind: causes.KindValidate, Resource: handlers[0].Resource}, {ID: "old", Kind: causes.KindMutate, Resource: handlers[0].Resource}}
				if _, err := s.Sync(t.Context(), old); err != nil {
					t.Fatal(err)
				}
			}
			// The other replica: the same syncer's configurations, written first.
			other, _ := testSyncer(t)
			other.Client = fake.NewClientset()
			if _, err := other.Sync(t.Context(), handlers); err != nil {
				t.Fatal(err)
			}
			raced := map[string]bool{}
			for _, resource := range []string{"validatingwebhookconfigurations", "mutatingwebhookconfigurations"} {
				client.PrependReactor(verb, resource, func(action clienttesting.Action) (bool, runtime.Object, error) {
					if raced[resource] {
						return false, nil, nil
					}
					raced[resource] = true
					gvr := admissionregistrationv1.SchemeGroupVersion.WithResource(resource)
					var winner runtime.Object
					var name string
					if resource == "validatingwebhookconfigurations" {
						v, _ := other.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), "ops.example.com.validate", metav1.GetOptions{})
						winner, name = v, v.Name
					} else {
						m, _ := other.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "ops.example.com.mutate", metav1.GetOptions{})
						winner, name = m, m.Name
					}
					winner.(metav1.Object).SetResourceVersion("") // the other API server's
					if verb == "create" {
						if err := client.Tracker().Create(gvr, winner, ""); err != nil {
							t.Fatal(err)
						}
						return true, nil, apierrors.NewAlreadyExists(gvr.GroupResource(), name)
					}
					if err := client.Tracker().Update(gvr, winner, ""); err != nil {
						t.Fatal(err)
					}
					return true, nil, apierrors.NewConflict(gvr.GroupResource(), name, errors.New("the object has been modified"))
				})
			}
			if _, err := s.Sync(t.Context(), handlers); err != nil {
				t.Fatalf("sync, another replica writing first: %v", err)
			}
			if len(raced) != 2 {
				t.Fatalf("the race was not staged for both configurations: %v", raced)
			}
			v, errV := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), "ops.example.com.validate", metav1.GetOptions{})
			m, errM := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), "ops.example.com.mutate", metav1.GetOptions{})
			if errV != nil || errM != nil || len(v.Webhooks) != 1 || len(m.Webhooks) != 1 {
				t.Fatalf("the configurations after the race: %v %v %+v %+v", errV, errM, v, m)
			}
		})
	}
}
