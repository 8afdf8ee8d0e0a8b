package admission

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
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

// probeWorld runs Webhooks with one Fail handler against a fake API server whose
// probe answers are chosen by the test: reached, or the API server's failure.
type probeWorld struct {
	w         *Webhooks
	client    *fake.Clientset
	reachable atomic.Bool
	reports   atomic.Int32
	last      atomic.Pointer[Reachability]
}

func startProbeWorld(t *testing.T, reachable bool, opts Options) *probeWorld {
	t.Helper()
	pw := &probeWorld{}
	pw.reachable.Store(reachable)
	opts.Address, opts.Prefix = "127.0.0.1:0", "ops.example.com"
	opts.detect = noDetection("https://127.0.0.1:6443")
	opts.ProbeBudget = 300 * time.Millisecond
	opts.OnReachability = func(r Reachability) { pw.reports.Add(1); pw.last.Store(&r) }
	w, err := New(&rest.Config{Host: "https://127.0.0.1:6443"}, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	pw.w = w
	pw.client = fake.NewClientset()
	pw.client.PrependReactor("create", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		obj := a.(clienttesting.CreateAction).GetObject().(*coordinationv1.Lease)
		token, ok := obj.Labels[ProbeLabel]
		if !ok {
			return false, nil, nil
		}
		gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
		if pw.reachable.Load() {
			return true, nil, apierrors.NewForbidden(gr, obj.Name, fmt.Errorf(`admission webhook "x" denied the request: %s`, probeMessage(token)))
		}
		return true, nil, apierrors.NewInternalError(fmt.Errorf(`failed calling webhook "reachability.probe.ops.example.com": failed to call webhook: Post "%s": dial tcp 198.18.0.1:4443: connect: no route to host`, w.URL(probePath)))
	})
	w.syncer.Client, w.syncer.Discovery, w.prober.client = pw.client, pw.client.Discovery(), pw.client
	w.resyncEvery = time.Hour
	scope := admissionregistrationv1.NamespacedScope
	if err := w.Register(Handler{ID: "cm", Kind: causes.KindValidate,
		Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{"*"},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}, Scope: &scope}}},
		Admit: func(context.Context, Request) (Response, error) { return Response{Allowed: true}, nil }}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return pw
}

func (pw *probeWorld) configurations(t *testing.T) (validate, probe bool) {
	t.Helper()
	api := pw.client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	_, errV := api.Get(t.Context(), "ops.example.com.validate", metav1.GetOptions{})
	_, errP := api.Get(t.Context(), "ops.example.com.probe", metav1.GetOptions{})
	return errV == nil, errP == nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Reached: the handlers' configuration is written after the probe.
func TestProbeReachedRegisters(t *testing.T) {
	pw := startProbeWorld(t, true, Options{})
	waitFor(t, "the validate configuration", func() bool { v, _ := pw.configurations(t); return v })
	r := pw.w.Reachability()
	if !r.Checked || !r.Reachable || !strings.HasPrefix(r.URL, "https://127.0.0.1:") {
		t.Errorf("Reachability = %+v", r)
	}
}

// Not reached: nothing is registered (no Fail webhook nobody answers), the probe's
// configuration is removed too, and the error says what to do.
func TestProbeNotReachedRegistersNothing(t *testing.T) {
	pw := startProbeWorld(t, false, Options{})
	waitFor(t, "a failed probe reported", func() bool { return pw.reports.Load() > 0 })
	if v, p := pw.configurations(t); v || p {
		t.Errorf("configurations left after a failed probe: validate %v, probe %v", v, p)
	}
	r := pw.w.Reachability()
	if !r.Checked || r.Reachable || !strings.Contains(r.Error, "no route to host") || !strings.Contains(r.Error, "--webhook-url") {
		t.Errorf("Reachability = %+v", r)
	}
	for _, a := range pw.client.Actions() {
		if a.GetVerb() == "create" && a.GetResource().Resource == "validatingwebhookconfigurations" {
			if c := a.(clienttesting.CreateAction).GetObject().(*admissionregistrationv1.ValidatingWebhookConfiguration); c.Name == "ops.example.com.validate" {
				t.Error("the handlers' configuration was written before the probe failed")
			}
		}
	}
}

// Reached, then not (the tunnel died): a later probe removes what was registered.
func TestProbeFailingLaterWithdraws(t *testing.T) {
	pw := startProbeWorld(t, true, Options{})
	waitFor(t, "the validate configuration", func() bool { v, _ := pw.configurations(t); return v })
	pw.reachable.Store(false)
	pw.w.reach.Store(&Reachability{Checked: true, Reachable: true, At: time.Now().Add(-2 * time.Hour)}) // due again
	pw.w.Resync()
	waitFor(t, "the configurations removed", func() bool { v, p := pw.configurations(t); return !v && !p })
	if r := pw.w.Reachability(); r.Reachable {
		t.Errorf("Reachability = %+v", r)
	}
}

// Inactive (a peer works): nothing is written until SetActive(true).
func TestInactiveWritesNothing(t *testing.T) {
	pw := startProbeWorld(t, true, Options{Inactive: true})
	pw.w.sync(t.Context()) // what Start's loop does on every trigger
	if v, p := pw.configurations(t); v || p {
		t.Fatalf("an inactive operator wrote configurations: validate %v, probe %v", v, p)
	}
	pw.w.SetActive(true)
	waitFor(t, "the validate configuration once active", func() bool { v, _ := pw.configurations(t); return v })
}
