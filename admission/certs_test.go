package admission

import (
	"crypto/x509"
	"encoding/pem"
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

// A generated certificate is renewed when a third of its validity is left, not
// before; the caBundle then trusts the new CA and the previous one (replicas and
// the API server switch at different times), and both certificates verify.
func TestGeneratedCertificatesRenewBeforeExpiry(t *testing.T) {
	c, err := NewGeneratedCertificates([]string{"hook.ops.svc"}, CertOptions{Validity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	changes := 0
	c.OnChange(func() { changes++ })
	first := leafOf(t, c)
	start := time.Now()
	if changed, err := c.rotate(t.Context(), start.Add(30*time.Minute)); err != nil || changed {
		t.Fatalf("renewed with two thirds of the validity left: %v %v", changed, err)
	}
	changed, err := c.rotate(t.Context(), start.Add(45*time.Minute))
	if err != nil || !changed {
		t.Fatalf("not renewed with a quarter of the validity left: %v %v", changed, err)
	}
	second := leafOf(t, c)
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || !second.NotAfter.After(first.NotAfter) {
		t.Fatalf("the renewed certificate is the same or expires no later: %v -> %v", first.NotAfter, second.NotAfter)
	}
	pool, n := poolOf(t, c.CABundle())
	if n != 2 {
		t.Errorf("caBundle has %d CAs, want the new and the previous one", n)
	}
	at := start.Add(45 * time.Minute)
	for name, leaf := range map[string]*x509.Certificate{"previous": first, "renewed": second} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "hook.ops.svc", Roots: pool, CurrentTime: at}); err != nil {
			t.Errorf("the %s certificate does not verify against the caBundle: %v", name, err)
		}
	}
	// Renewed again after the first CA expired: it leaves the bundle.
	if changed, err := c.rotate(t.Context(), second.NotAfter.Add(-10*time.Minute)); err != nil || !changed {
		t.Fatalf("second renewal: %v %v", changed, err)
	}
	if _, n := poolOf(t, c.CABundle()); n != 2 {
		t.Errorf("after the second renewal the bundle has %d CAs, want 2 (the oldest, expired, dropped)", n)
	}
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
	if _, n := poolOf(t, sec.Data["ca.crt"]); n != 2 {
		t.Errorf("the Secret's ca.crt has %d CAs, want the new and the previous", n)
	}
}
