package e2e

// Issue 37: what a platform team checks before adopting luaop. The webhook's
// generated certificate is renewed while serving, its CA too, and the API server
// keeps calling the webhook through every change (a short-lived certificate, so that
// a year passes in seconds); /metrics answers only the clients the API server
// authenticates and authorizes, as controller-runtime's secure metrics.

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/testcluster"
)

// servedSerial is the serial number of the certificate the webhook server presents.
func servedSerial(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the served certificate only
	if err != nil {
		t.Fatalf("TLS to the webhook server: %v", err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

func TestWebhookCertificateRotatesWhileServing(t *testing.T) {
	ns := env.Namespace(t)
	op := startWith(t, ns, operator.Options{Scripts: script(`
local luaop = require("luaop")
luaop.on.validate("e2e.luaop.dev/v1/doohickeys", function(ctx)
  return false, "refused by the rotation test"
end, {id = "refuse", operations = {"CREATE"}})
`)})
	prefix := ns + ".e2e.luaop.dev"
	const validity = 12 * time.Second
	wh, _ := serveWebhooks(t, op, ns, prefix, admission.Options{CertValidity: validity})
	err := eventuallyRejected(t, ns, doohickey("probe", "{size: 1}"), false)
	mustContain(t, err, "refused by the rotation test")

	bundleOf := func() string {
		cfg, err := env.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), prefix+".validate", metav1.GetOptions{})
		if err != nil || len(cfg.Webhooks) == 0 {
			t.Fatalf("the configuration: %v", err)
		}
		return string(cfg.Webhooks[0].ClientConfig.CABundle)
	}
	serials := map[string]bool{servedSerial(t, wh.Addr().String()): true}
	bundles := map[string]bool{bundleOf(): true}
	// Through two renewals of the serving certificate and one of the CA (about
	// 18 s with a 12 s validity), every request reaches the handler: none fails
	// on TLS, whatever the moment.
	deadline := time.Now().Add(4 * validity)
	requests := 0
	for time.Now().Before(deadline) && (len(serials) < 3 || len(bundles) < 2) {
		_, err := createDoohickey(t, ns, doohickey(fmt.Sprintf("d%d", requests), "{size: 1}"), false)
		requests++
		if err == nil || !strings.Contains(err.Error(), "refused by the rotation test") {
			if err == nil {
				_ = env.Dynamic.Resource(doohickeys).Namespace(ns).Delete(t.Context(), fmt.Sprintf("d%d", requests-1), metav1.DeleteOptions{})
			}
			if !apierrors.IsAlreadyExists(err) {
				t.Fatalf("request %d during the rotation: %v; want the handler's refusal (the API server did not reach the webhook?)", requests, err)
			}
		}
		serials[servedSerial(t, wh.Addr().String())] = true
		bundles[bundleOf()] = true
		time.Sleep(200 * time.Millisecond)
	}
	if len(serials) < 3 || len(bundles) < 2 {
		t.Fatalf("after %s: %d serving certificates and %d caBundles seen; want 3 and 2 (renewed twice, a new CA once)", 4*validity, len(serials), len(bundles))
	}
	if left := time.Until(wh.Certificates().NotAfter()); left <= 0 {
		t.Errorf("the certificate served has expired (%s ago)", -left)
	}
	t.Logf("%d requests, all answered by the handler, through %d certificates and %d caBundles", requests, len(serials), len(bundles))
	testcluster.Eventually(t, 5*time.Second, func() (bool, string) {
		return strings.Contains(op.Log.String(), "webhook CA renewed"), "no log of the CA renewal"
	})
}

// The scripts' server-side applies are made as the operator's field manager, which
// follows --prefix: two operators own their applied fields apart.
func TestApplyFieldManagerFollowsPrefix(t *testing.T) {
	ns := env.Namespace(t)
	const prefix = "team-a.example.com"
	startWith(t, ns, operator.Options{FieldManager: operator.FieldManagerFor(prefix), Scripts: script(`
local luaop = require("luaop")
luaop.on.create("v1/configmaps", function(ctx)
  local cm, err = luaop.kube.apply({apiVersion = "v1", kind = "ConfigMap",
    metadata = {name = ctx.name .. "-applied", namespace = ctx.namespace}, data = {from = ctx.name}})
  if not cm then error(err) end
end, {id = "apply", labels = {["e2e.luaop.dev/apply"] = "yes"}})
`)})
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "src",
		Labels: map[string]string{"e2e.luaop.dev/apply": "yes"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testcluster.Eventually(t, 30*time.Second, func() (bool, string) {
		cm, err := env.Kube.CoreV1().ConfigMaps(ns).Get(t.Context(), "src-applied", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var managers []string
		for _, mf := range cm.ManagedFields {
			managers = append(managers, mf.Manager+"/"+string(mf.Operation))
		}
		return slices.Contains(managers, "luaop-team-a.example.com/Apply"), fmt.Sprintf("managers %v", managers)
	})
}
