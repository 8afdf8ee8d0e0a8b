package admission

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// poolOf parses a caBundle into a pool, and counts its CAs.
func poolOf(t *testing.T, bundle []byte) (*x509.CertPool, int) {
	t.Helper()
	pool := x509.NewCertPool()
	n := 0
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return pool, n
		}
		ca, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		pool.AddCert(ca)
		n++
	}
}

func leafOf(t *testing.T, c *Certificates) *x509.Certificate {
	t.Helper()
	pair, _ := c.GetCertificate(nil)
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// A generated serving certificate is renewed when a third of its validity is left,
// not before, by the same CA (the caBundle does not change); when the CA would
// expire before a new serving certificate, a new CA joins the bundle first, and
// signs only once the bundle was published (gated): the API server trusts it before
// it is used. Every certificate served verifies against the bundle of its time.
func TestGeneratedCertificatesRenewBeforeExpiry(t *testing.T) {
	c, err := NewGeneratedCertificates([]string{"hook.ops.svc"}, CertOptions{Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.GatePublication()
	changes := 0
	c.OnChange(func() { changes++ })
	first := leafOf(t, c)
	bundle0 := c.CABundle()
	start := time.Now()
	verify := func(when string, leaf *x509.Certificate, at time.Time) {
		t.Helper()
		pool, _ := poolOf(t, c.CABundle())
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "hook.ops.svc", Roots: pool, CurrentTime: at}); err != nil {
			t.Errorf("%s: the certificate does not verify against the caBundle: %v", when, err)
		}
	}
	if changed, err := c.rotate(t.Context(), start.Add(30*time.Minute)); err != nil || changed {
		t.Fatalf("renewed with two thirds of the validity left: %v %v", changed, err)
	}
	at := start.Add(45 * time.Minute)
	if changed, err := c.rotate(t.Context(), at); err != nil || !changed {
		t.Fatalf("not renewed with a quarter of the validity left: %v %v", changed, err)
	}
	second := leafOf(t, c)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || !second.NotAfter.After(first.NotAfter) {
		t.Fatalf("the renewed certificate is the same or expires no later: %v -> %v", first.NotAfter, second.NotAfter)
	}
	if string(c.CABundle()) != string(bundle0) {
		t.Error("a renewal by the same CA changed the caBundle")
	}
	verify("after the first renewal", second, at)

	// The CA (valid two hours) would expire before a new certificate: a new CA
	// joins the bundle, the certificate stays.
	at = second.NotAfter.Add(-15 * time.Minute)
	if changed, err := c.rotate(t.Context(), at); err != nil || !changed {
		t.Fatalf("no new CA: %v %v", changed, err)
	}
	if _, n := poolOf(t, c.CABundle()); n != 2 || leafOf(t, c).SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatalf("after the CA renewal: %d CAs in the bundle (want 2), serving certificate changed: %v", n, leafOf(t, c).SerialNumber.Cmp(second.SerialNumber) != 0)
	}
	// Not published yet: the new CA does not sign.
	if changed, err := c.rotate(t.Context(), at); err != nil || changed {
		t.Fatalf("the new CA signed before its bundle was published: %v %v", changed, err)
	}
	c.Published(c.CABundle())
	if changed, err := c.rotate(t.Context(), at.Add(2*time.Minute)); err != nil || !changed {
		t.Fatalf("the published new CA does not sign: %v %v", changed, err)
	}
	third := leafOf(t, c)
	if third.SerialNumber.Cmp(second.SerialNumber) == 0 {
		t.Fatal("no new certificate")
	}
	verify("the previous certificate during the CA switch", second, at)
	verify("the certificate of the new CA", third, at.Add(2*time.Minute))
	if changes != 0 {
		t.Errorf("rotate (the test's direct call) called OnChange %d times; Rotate calls it", changes)
	}
	if err := c.Rotate(t.Context()); err != nil || changes != 0 {
		t.Errorf("Rotate of a fresh certificate: %v, %d changes", err, changes)
	}
}

// Replicas sharing the Secret renew once: the first to see it due writes the
// Secret, the others take its certificate up.
func TestSecretCertificatesRenewedOnceForAllReplicas(t *testing.T) {
	client := fake.NewClientset()
	ctx := t.Context()
	opts := CertOptions{Validity: time.Hour}
	a, err := NewSecretCertificates(ctx, client, "ops", "hook-tls", []string{"hook.ops.svc"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewSecretCertificates(ctx, client, "ops", "hook-tls", []string{"hook.ops.svc"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	first := leafOf(t, a)
	later := time.Now().Add(45 * time.Minute)
	if changed, err := a.rotate(ctx, later); err != nil || !changed {
		t.Fatalf("replica a did not renew: %v %v", changed, err)
	}
	if changed, err := b.rotate(ctx, later); err != nil || !changed {
		t.Fatalf("replica b did not take the renewal up: %v %v", changed, err)
	}
	la, lb := leafOf(t, a), leafOf(t, b)
	if la.SerialNumber.Cmp(first.SerialNumber) == 0 || la.SerialNumber.Cmp(lb.SerialNumber) != 0 {
		t.Errorf("after the renewal: a serves %v, b %v (first %v): want one new certificate", la.SerialNumber, lb.SerialNumber, first.SerialNumber)
	}
	if string(a.CABundle()) != string(b.CABundle()) {
		t.Error("the replicas' caBundles differ")
	}
	sec, err := client.CoreV1().Secrets("ops").Get(ctx, "hook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.Data["ca.key"]) == 0 {
		t.Error("the Secret keeps no ca.key: the next renewal could not sign with its CA")
	}
}

// Certificates from a folder (cert-manager's Secret mounted): when the CA changes,
// the bundle keeps the previous CA while it is valid, so that the API server still
// trusts replicas whose volume the kubelet has not refreshed yet.
func TestFolderCertificatesKeepThePreviousCA(t *testing.T) {
	dir := t.TempDir()
	write := func() {
		t.Helper()
		certPEM, keyPEM, caPEM, err := generatePEM([]string{"127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": caPEM} {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	write()
	c, err := LoadCertificates(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, n := poolOf(t, c.CABundle()); n != 1 {
		t.Fatalf("the first bundle holds %d CAs, want 1", n)
	}
	time.Sleep(10 * time.Millisecond) // a newer modification time
	write()
	if err := c.Rotate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, n := poolOf(t, c.CABundle()); n != 2 {
		t.Fatalf("after the CA changed the bundle holds %d CAs, want 2 (the new and the previous)", n)
	}
}
