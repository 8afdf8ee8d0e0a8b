package admission

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"

	"github.com/luaop/luaop/processing/causes"
)

// Where the API server is told to call the webhooks, and when it cannot.
func TestWebhooksClientConfig(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		opts       Options
		url        string
		service    bool
		unreach    string
	}{
		{name: "local control plane", host: "https://127.0.0.1:6443", url: "https://127.0.0.1:"},
		{name: "remote cluster, loopback", host: "https://10.1.2.3:6443", url: "https://127.0.0.1:",
			unreach: "the cluster at https://10.1.2.3:6443 is not on this machine and cannot call the webhook"},
		{name: "remote cluster, url", host: "https://10.1.2.3:6443", opts: Options{URL: "https://tunnel.example.com:8443"},
			url: "https://tunnel.example.com:8443/validate/x"},
		{name: "in cluster", host: "https://10.1.2.3:6443", opts: Options{Service: "ops/hooks", DryRun: true}, service: true,
			unreach: "dry run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Address = "127.0.0.1:0"
			tc.opts.detect = noDetection(tc.host)
			w, err := New(&rest.Config{Host: tc.host}, nil, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer w.ln.Close()
			if got := w.URL("/validate/x"); !strings.HasPrefix(got, tc.url) || (tc.service && got != "") {
				t.Errorf("URL = %q, want %q...", got, tc.url)
			}
			cc := w.syncer.ClientConfig("/validate/x")
			if tc.service && (cc.Service == nil || cc.Service.Namespace != "ops" || *cc.Service.Path != "/validate/x" || *cc.Service.Port != 443) {
				t.Errorf("service client config %+v", cc.Service)
			}
			if tc.unreach == "" && w.Unreachable() != "" || !strings.Contains(w.Unreachable(), tc.unreach) {
				t.Errorf("Unreachable() = %q, want %q", w.Unreachable(), tc.unreach)
			}
		})
	}
}

// noDetection is the detection of a cluster with no nodes and nothing known: a
// local control plane, or nothing for a remote one.
func noDetection(host string) func(context.Context) (Endpoint, bool) {
	return func(context.Context) (Endpoint, bool) {
		if serverOnThisMachine(&rest.Config{Host: host}) {
			return Endpoint{Host: "127.0.0.1", Listen: "127.0.0.1", How: "the API server runs on this machine"}, true
		}
		return Endpoint{}, false
	}
}

// answerProbes makes the fake API server answer the reachability probe's dry runs
// as a real one does: rejected by the probe webhook while reached() (nil: always),
// else failing to call it.
func answerProbes(client *fake.Clientset, w *Webhooks, reached func() bool) {
	client.PrependReactor("create", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		obj := a.(clienttesting.CreateAction).GetObject().(*coordinationv1.Lease)
		token, ok := obj.Labels[ProbeLabel]
		if !ok {
			return false, nil, nil
		}
		if reached == nil || reached() {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, obj.Name,
				fmt.Errorf(`admission webhook "reachability.probe.ops.example.com" denied the request: %s`, probeMessage(token)))
		}
		return true, nil, apierrors.NewInternalError(fmt.Errorf(`failed calling webhook "reachability.probe.ops.example.com": failed to call webhook: Post "%s": dial tcp 198.18.0.1:4443: connect: no route to host`, w.URL(probePath)))
	})
}

// startOnFakeAPI runs Webhooks against client-go's fake clientset standing for the
// API server of a local control plane (newOnFakeAPI). They stop when the test ends.
func startOnFakeAPI(t *testing.T, opts Options, reached func() bool, resyncEvery time.Duration) (*Webhooks, *fake.Clientset) {
	t.Helper()
	w, client := newOnFakeAPI(t, opts, reached, resyncEvery)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return w, client
}

// newOnFakeAPI makes Webhooks on client-go's fake clientset standing for the API
// server of a local control plane: opts on a loopback address with the prefix
// ops.example.com, one Go handler (so a validating configuration is written), the
// probe answered as answerProbes does, a periodic sync every resyncEvery; not
// started.
func newOnFakeAPI(t *testing.T, opts Options, reached func() bool, resyncEvery time.Duration) (*Webhooks, *fake.Clientset) {
	t.Helper()
	w, client := newWithoutHandlersOnFakeAPI(t, opts, reached, resyncEvery)
	scope := admissionregistrationv1.NamespacedScope
	if err := w.Register(Handler{ID: "cm", Kind: causes.KindValidate,
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"*"},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}, Scope: &scope}}},
		Admit: func(context.Context, Request) (Response, error) { return Response{Allowed: true}, nil }}); err != nil {
		t.Fatal(err)
	}
	return w, client
}

// newWithoutHandlersOnFakeAPI is newOnFakeAPI without its handler: Webhooks of
// scripts that have no admission handler.
func newWithoutHandlersOnFakeAPI(t *testing.T, opts Options, reached func() bool, resyncEvery time.Duration) (*Webhooks, *fake.Clientset) {
	t.Helper()
	opts.Address, opts.Prefix = "127.0.0.1:0", "ops.example.com"
	opts.detect = noDetection("https://127.0.0.1:6443")
	w, err := New(&rest.Config{Host: "https://127.0.0.1:6443"}, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	answerProbes(client, w, reached)
	w.syncer.Client, w.syncer.Discovery, w.prober.client = client, client.Discovery(), client
	w.resyncEvery = resyncEvery
	t.Cleanup(func() { w.ln.Close() })
	return w, client
}

// writeCerts writes a fresh CA and serving certificate into dir, stamped at mod.
func writeCerts(t *testing.T, dir string, mod time.Time) []byte {
	t.Helper()
	certPEM, keyPEM, caPEM, err := generatePEM(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": caPEM} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	return caPEM
}

// startWebhooks runs Webhooks with certificates from dir on the fake API server
// (startOnFakeAPI).
func startWebhooks(t *testing.T, dir string, every time.Duration) (*Webhooks, *fake.Clientset) {
	t.Helper()
	return startOnFakeAPI(t, Options{CertDir: dir}, nil, every)
}

// caBundleEventually polls the validating configuration until its caBundle is want.
func caBundleEventually(t *testing.T, client *fake.Clientset, want []byte, why string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		vc, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), "ops.example.com.validate", metav1.GetOptions{})
		if err == nil && len(vc.Webhooks) == 1 && bytes.Equal(bytes.TrimSpace(vc.Webhooks[0].ClientConfig.CABundle), bytes.TrimSpace(want)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the configuration's caBundle is not the current CA (%v)", why, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A certificate rotated in --webhook-cert-dir reaches the caBundle without
// anything else happening: the reload triggers a sync.
func TestRotatedCertificatePushesCABundle(t *testing.T) {
	dir := t.TempDir()
	ca1 := writeCerts(t, dir, time.Now().Add(-time.Hour))
	w, client := startWebhooks(t, dir, time.Hour) // no periodic sync within the test
	caBundleEventually(t, client, ca1, "at start")

	ca2 := writeCerts(t, dir, time.Now())
	w.certs.checked.Store(0)                               // as if reloadEvery had passed
	if _, err := w.certs.GetCertificate(nil); err != nil { // a TLS handshake
		t.Fatal(err)
	}
	// The new CA first, the previous one kept while valid (replicas not yet
	// reloaded still serve leaves it signed).
	caBundleEventually(t, client, bundleWith(ca2, ca1, time.Now()), "after the rotation")
}

// A configuration deleted (or edited) by someone else is written again by the
// periodic sync; a periodic sync of an unchanged configuration writes nothing.
func TestPeriodicResyncRepairs(t *testing.T) {
	dir := t.TempDir()
	ca := writeCerts(t, dir, time.Now().Add(-time.Hour))
	_, client := startWebhooks(t, dir, 50*time.Millisecond)
	caBundleEventually(t, client, ca, "at start")
	api := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if err := api.Delete(t.Context(), "ops.example.com.validate", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	caBundleEventually(t, client, ca, "after a deletion")
	// Several periodic syncs of the unchanged configuration: no write (the probe
	// is checked again, by a dry run).
	client.ClearActions()
	deadline := time.Now().Add(30 * time.Second)
	for gets := 0; gets < 3; {
		gets = 0
		for _, a := range client.Actions() {
			if a.GetResource().Resource == "leases" {
				continue // the reachability probe's dry runs, which store nothing
			}
			switch a.GetVerb() {
			case "get":
				gets++
			case "create", "update", "delete":
				t.Fatalf("an unchanged periodic sync wrote: %s", a.GetVerb())
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no periodic sync seen")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The operator stops (RemoveOnExit) while a sync is under way: it wrote the
// probe's and the validating configuration, and its read of the mutating one is
// cut short by the stop (client-go returns the context's error). What the sync
// wrote is removed all the same before Start returns: it was left behind (e2e
// TestAdmissionConfigurationsRemovedWhenAsked), the API server then calling a Fail
// webhook nobody answers.
func TestStopDuringASyncRemovesWhatItWrote(t *testing.T) {
	w, client := newOnFakeAPI(t, Options{RemoveOnExit: true}, nil, time.Hour)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	inFlight := make(chan struct{})
	var once sync.Once
	client.PrependReactor("get", "mutatingwebhookconfigurations", func(clienttesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(inFlight) })
		<-ctx.Done() // held until the stop, which ends the request
		return true, nil, fmt.Errorf("get mutatingwebhookconfigurations: %w", ctx.Err())
	})
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	select {
	case <-inFlight:
	case <-time.After(10 * time.Second):
		t.Fatal("no sync reached the mutating configuration")
	}
	// The clientset is locked while its reactor holds the sync: its tracker is not.
	validating := admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations")
	for _, name := range []string{"ops.example.com.validate", "ops.example.com.probe"} {
		if _, err := client.Tracker().Get(validating, "", name); err != nil {
			t.Fatalf("%s before the stop: %v; the sync held should have written it", name, err)
		}
	}
	cancel()
	api := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ops.example.com.validate", "ops.example.com.probe"} {
		if _, err := api.Get(context.Background(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s after the stop with RemoveOnExit: %v; want it removed", name, err)
		}
	}
}

// A configuration the operator cannot remove at exit (RemoveOnExit) is named in
// the log with what to do: the API server keeps calling a webhook nobody answers.
func TestRemovalRefusedAtExitSaysWhatToDo(t *testing.T) {
	var logged bytes.Buffer
	w, client := newOnFakeAPI(t, Options{RemoveOnExit: true, Logger: slog.New(slog.NewTextHandler(&logged, nil))}, nil, time.Hour)
	client.PrependReactor("delete", "validatingwebhookconfigurations", func(a clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations"},
			a.(clienttesting.DeleteAction).GetName(), errors.New("no delete granted"))
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	waitFor(t, "the first sync", w.Synced)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	out := logged.String()
	for _, want := range []string{"not removed at exit", "luaop webhooks remove --prefix ops.example.com", "ops.example.com.validate", "no delete granted"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, `msg="webhook configurations removed"`) {
		t.Errorf("the log says they were removed:\n%s", out)
	}
}

// configurationRequests are the requests of the fake API server's log on webhook
// configurations ("get validatingwebhookconfigurations", ...).
func configurationRequests(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if strings.HasSuffix(a.GetResource().Resource, "webhookconfigurations") {
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

// Issue 45: scripts without an admission handler make the operator neither read
// nor write the webhook configurations (luaop rbac grants it no right on them: a
// least-privilege operator was refused a read, in red, every 10 s).
func TestNoAdmissionHandlerReadsNoConfiguration(t *testing.T) {
	var logged bytes.Buffer
	w, client := newWithoutHandlersOnFakeAPI(t, Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))}, nil, time.Hour)
	client.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(a.GetResource().GroupResource(), "", errors.New("least privilege"))
	})
	for range 3 {
		if !w.sync(t.Context()) {
			t.Errorf("a sync with nothing to write failed")
		}
	}
	if got := configurationRequests(client); len(got) > 0 {
		t.Errorf("requests on the webhook configurations without any admission handler: %q", got)
	}
	if strings.Contains(logged.String(), "level=ERROR") {
		t.Errorf("errors logged without any admission handler:\n%s", logged.String())
	}
	if !w.Synced() {
		t.Errorf("not synced: nothing was to be written")
	}
}

// Issue 45: a refused read of a configuration (admission handlers, but no right on
// the configurations) is said once, at error level, with the exact rule missing;
// the syncs retried after it say nothing more at that level.
func TestRefusedReadOfAConfigurationIsSaidOnceWithTheRuleMissing(t *testing.T) {
	var logged bytes.Buffer
	w, client := newOnFakeAPI(t, Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))}, nil, time.Hour)
	client.PrependReactor("get", "validatingwebhookconfigurations", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.GetAction).GetName() != "ops.example.com.validate" {
			return false, nil, nil // the probe's: granted
		}
		return true, nil, apierrors.NewForbidden(a.GetResource().GroupResource(), "ops.example.com.validate",
			errors.New(`User "system:serviceaccount:ops:luaop" cannot get resource "validatingwebhookconfigurations"`))
	})
	for range 3 {
		if w.sync(t.Context()) {
			t.Fatalf("a refused sync succeeded")
		}
	}
	out := logged.String()
	rule := "{apiGroups: [admissionregistration.k8s.io], resources: [validatingwebhookconfigurations], verbs: [get]}"
	if n := strings.Count(out, "level=ERROR"); n != 1 {
		t.Errorf("%d error lines for one refusal, want 1:\n%s", n, out)
	}
	for _, want := range []string{rule, "ops.example.com.validate", "luaop rbac"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
}
