package admission

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// probeWorld runs Webhooks with one Fail handler against a fake API server whose
// probe answers are chosen by the test: reached, or the API server's failure.
type probeWorld struct {
	w         *Webhooks
	client    *fake.Clientset
	reachable atomic.Bool
	reports   atomic.Int32
	last      atomic.Pointer[Reachability]
	// hold, when set before Start, holds every sync after its probe (before it
	// writes) until it is closed; held is told of each sync so held.
	hold, held chan struct{}
}

func startProbeWorld(t *testing.T, reachable bool, opts Options, setup ...func(*probeWorld)) *probeWorld {
	t.Helper()
	pw := &probeWorld{}
	for _, f := range setup {
		f(pw)
	}
	pw.reachable.Store(reachable)
	opts.ProbeBudget = 300 * time.Millisecond
	opts.OnReachability = func(r Reachability) {
		pw.reports.Add(1)
		pw.last.Store(&r)
		if pw.hold != nil {
			select {
			case pw.held <- struct{}{}:
			default:
			}
			<-pw.hold
		}
	}
	pw.w, pw.client = startOnFakeAPI(t, opts, pw.reachable.Load, time.Hour)
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
	// OnReachability is told before the sync withdraws what the probe wrote: the
	// probe's configuration goes a moment after the report.
	waitFor(t, "a failed probe reported and no configuration left", func() bool {
		v, p := pw.configurations(t)
		return pw.reports.Load() > 0 && !v && !p
	})
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

// A sync under way when the operator stops owning the configurations (peering
// pauses it) ends before WaitIdle returns: a peer that writes its own as soon as
// this operator's pause returned keeps them (they were overwritten by the paused
// operator's sync, the API server then calling an operator that handles nothing).
func TestNoSyncOfAnInactiveOperatorOutlivesWaitIdle(t *testing.T) {
	pw := startProbeWorld(t, true, Options{}, func(pw *probeWorld) {
		pw.hold, pw.held = make(chan struct{}), make(chan struct{}, 1)
	})
	select {
	case <-pw.held: // the first sync has probed and is about to write
	case <-time.After(10 * time.Second):
		t.Fatal("no probe")
	}
	pw.w.SetActive(false)
	api := pw.client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	peerURL := "https://peer.example.com:8443/validate"
	peerDone := make(chan error, 1)
	go func() {
		if err := pw.w.WaitIdle(t.Context()); err != nil {
			peerDone <- err
			return
		}
		// The peer takes over at once: its configuration, created or overwritten.
		peer := &admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "ops.example.com.validate"},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "cm.validate.ops.example.com",
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &peerURL}}}}
		_, err := api.Create(context.Background(), peer, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var cur *admissionregistrationv1.ValidatingWebhookConfiguration
			if cur, err = api.Get(context.Background(), peer.Name, metav1.GetOptions{}); err == nil {
				cur.Webhooks = peer.Webhooks
				_, err = api.Update(context.Background(), cur, metav1.UpdateOptions{})
			}
		}
		peerDone <- err
	}()
	var err error
	select {
	case err = <-peerDone:
		close(pw.hold)
	case <-time.After(300 * time.Millisecond): // WaitIdle waits for the sync held
		close(pw.hold)
		err = <-peerDone
	}
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the sync under way at SetActive(false) ended", pw.w.Synced)
	vc, err := api.Get(t.Context(), "ops.example.com.validate", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := vc.Webhooks[0].ClientConfig.URL; got == nil || *got != peerURL {
		t.Errorf("the peer's configuration was overwritten by the paused operator's: %+v", vc.Webhooks[0].ClientConfig)
	}
}

// A probe configuration left behind by an operator of another prefix (answered by
// nobody, failure policy Fail) must not cover this operator's probe Lease: it did,
// and every later probe of any prefix failed with "connection refused".
func TestProbeConfigurationCoversOnlyItsOwnPrefixesProbes(t *testing.T) {
	noClient := func() admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{}
	}
	mine := &prober{prefix: "ops.example.com", namespace: "luaop", clientConfig: noClient}
	other := &prober{prefix: "other.example.com", namespace: "luaop", clientConfig: mine.clientConfig}
	leaseLabels := func(p *prober) labels.Set {
		return labels.Set{ProbeLabel: "0123456789abcdef", ProbeOwnerLabel: probeOwner(p.prefix)}
	}
	covers := func(p *prober, l labels.Set) bool {
		sel, err := metav1.LabelSelectorAsSelector(p.configuration().Webhooks[0].ObjectSelector)
		if err != nil {
			t.Fatal(err)
		}
		return sel.Matches(l)
	}
	if !covers(mine, leaseLabels(mine)) || !covers(other, leaseLabels(other)) {
		t.Error("a probe configuration does not cover its own probe Lease")
	}
	if covers(other, leaseLabels(mine)) || covers(mine, leaseLabels(other)) {
		t.Error("a probe configuration covers another prefix's probe Lease")
	}
	if covers(mine, labels.Set{ProbeOwnerLabel: probeOwner(mine.prefix)}) || covers(mine, labels.Set{"app": "x"}) {
		t.Error("a probe configuration covers a Lease without a probe token")
	}
	if v := probeOwner(strings.Repeat("a.", 120) + "example.com"); len(v) > 63 {
		t.Errorf("probeOwner of a long prefix is %d characters, over a label value's 63", len(v))
	}
}

// Replicas start together and each writes the probe's configuration: the one
// whose create or update loses the race (AlreadyExists, Conflict) reads the
// winner's copy and compares again, instead of failing the probe. The fake API
// server has another replica write first, between this one's read and write.
func TestProbeConfigurationRaceWithAnotherReplica(t *testing.T) {
	noClient := func() admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{}
	}
	mine := &prober{prefix: "ops.example.com", namespace: "luaop", clientConfig: noClient}
	stale := mine.configuration()
	stale.Webhooks[0].Name = "an.older.probe"
	for _, tc := range []struct {
		name string
		// existing is what the API server holds before; verb the write that races.
		existing *admissionregistrationv1.ValidatingWebhookConfiguration
		verb     string
	}{
		{"both create it", nil, "create"},
		{"both update an older one", stale, "update"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.existing != nil {
				if err := client.Tracker().Add(tc.existing.DeepCopy()); err != nil {
					t.Fatal(err)
				}
			}
			raced := false
			client.PrependReactor(tc.verb, "validatingwebhookconfigurations", func(action clienttesting.Action) (bool, runtime.Object, error) {
				if raced {
					return false, nil, nil
				}
				raced = true
				// The other replica's write lands first.
				gvr := admissionregistrationv1.SchemeGroupVersion.WithResource("validatingwebhookconfigurations")
				winner := mine.configuration()
				if tc.existing == nil {
					if err := client.Tracker().Create(gvr, winner, ""); err != nil {
						t.Fatal(err)
					}
					return true, nil, apierrors.NewAlreadyExists(gvr.GroupResource(), winner.Name)
				}
				if err := client.Tracker().Update(gvr, winner, ""); err != nil {
					t.Fatal(err)
				}
				return true, nil, apierrors.NewConflict(gvr.GroupResource(), winner.Name, errors.New("the object has been modified"))
			})
			p := *mine
			p.client = client
			if err := p.ensure(t.Context()); err != nil {
				t.Fatalf("ensure, another replica writing first: %v", err)
			}
			if !raced {
				t.Fatal("the race was not staged: no " + tc.verb)
			}
			got, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), "ops.example.com.probe", metav1.GetOptions{})
			if err != nil || got.Webhooks[0].Name != "reachability.probe.ops.example.com" {
				t.Fatalf("the probe's configuration after the race: %v %+v", err, got)
			}
		})
	}
}

// Through a Service, a probe failing first (a replica just took the webhooks
// over) or right after one succeeded (a replica replaced: the API server still
// calls the gone pod's address for a moment) is a warning, checked again in
// retryEvery; failing again, an error, said once. Nothing is
// withdrawn either way: replicas behind a Service keep their webhooks.
func TestServiceProbeFailingOnceIsAWarning(t *testing.T) {
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var reachable atomic.Bool
	certs := t.TempDir()
	writeCerts(t, certs, time.Now())
	w, _ := newOnFakeAPI(t, Options{Service: "ops/hooks", CertDir: certs, Logger: log, ProbeBudget: 300 * time.Millisecond}, reachable.Load, time.Hour)
	steps := []struct {
		reachable, due bool
		wantOK         bool   // sync's answer: false is a retry in retryEvery
		wantLevel      string // of the probe's line, "" for none
	}{
		{reachable: false, wantOK: false, wantLevel: "WARN"},
		{reachable: true, wantOK: true, wantLevel: "INFO"},
		{reachable: false, due: true, wantOK: false, wantLevel: "WARN"},
		{reachable: true, wantOK: true, wantLevel: "INFO"},
		{reachable: false, due: true, wantOK: false, wantLevel: "WARN"},
		{reachable: false, wantOK: true, wantLevel: "ERROR"},
		{reachable: false, wantOK: true, wantLevel: ""},
	}
	for i, st := range steps {
		reachable.Store(st.reachable)
		if st.due {
			r := *w.reach.Load()
			r.At = time.Now().Add(-2 * time.Hour)
			w.reach.Store(&r)
		}
		logs.Reset()
		ok := w.sync(t.Context())
		level := ""
		for _, l := range []string{"ERROR", "WARN", "INFO"} {
			if strings.Contains(logs.String(), "level="+l+" msg=\"the API server cannot call") || (l == "INFO" && strings.Contains(logs.String(), "level=INFO msg=\"webhook server reachable")) {
				level = l
				break
			}
		}
		if ok != st.wantOK || level != st.wantLevel {
			t.Errorf("step %d (reachable %v): sync %v, want %v; probe logged at %q, want %q:\n%s", i, st.reachable, ok, st.wantOK, level, st.wantLevel, logs.String())
		}
	}
}
