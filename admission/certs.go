package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Certificates serve the webhook's TLS: from a folder (tls.crt, tls.key and, when
// present, ca.crt: what cert-manager or a mounted kubernetes.io/tls Secret
// provide), read again when the files change; or generated (a CA and a serving
// certificate it signs), in memory or shared by the replicas through a Secret, and
// renewed before they expire. Run watches and rotates them; OnChange learns of
// every change, so that the caBundle of the configurations follows without a
// restart.
type Certificates struct {
	dir string
	// gen makes new certificates (generated and Secret sources); secret, when set,
	// is where they are kept.
	gen    *generator
	secret *secretSource
	log    *slog.Logger

	state     atomic.Pointer[certState]
	checked   atomic.Int64 // when the folder was last looked at (UnixNano)
	reloading atomic.Bool  // one reader of the folder at a time
	rotateMu  sync.Mutex   // one rotation at a time (Run and tests); never held while calling out of the package
	// gated: the caBundle is published (the webhook configurations): a new CA
	// signs serving certificates only once the bundle holding it was published
	// (Published) propagation ago, so that the API server trusts it first.
	gated       atomic.Bool
	published   atomic.Pointer[publication]
	propagation time.Duration
	// onChange is called (without any lock held) after a reload changed the
	// certificate or the CA; set by OnChange before serving.
	onChange atomic.Pointer[func()]
}

// certState is one certificate and its CA, swapped as a whole.
type certState struct {
	cert *tls.Certificate
	ca   []byte // PEM of the CAs to trust (the caBundle): the newest first, and the previous one while it is valid
	// leaf is cert's parsed leaf (its validity decides the renewal).
	leaf *x509.Certificate
	// caKey is the key of the newest CA of ca (generated certificates), which
	// signs the next leaf; nil when unknown (then a new CA is made first).
	caKey   *ecdsa.PrivateKey
	modTime time.Time
	// version is the Secret's resourceVersion the state was read from.
	version string
}

// newestCA is the first CA of the bundle.
func (st *certState) newestCA() *x509.Certificate {
	block, _ := pem.Decode(st.ca)
	if block == nil {
		return nil
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil
	}
	return ca
}

// CertOptions configure generated certificates.
type CertOptions struct {
	// Validity of a generated CA and serving certificate. Defaults to one year;
	// they are renewed when a third of it is left.
	Validity time.Duration
	// Logger receives the renewals. Defaults to slog.Default().
	Logger *slog.Logger
}

// DefaultCertValidity is how long a generated certificate is valid.
const DefaultCertValidity = 365 * 24 * time.Hour

func (o CertOptions) withDefaults() CertOptions {
	if o.Validity <= 0 {
		o.Validity = DefaultCertValidity
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// generator makes a CA and a serving certificate for hosts. A CA is valid twice as
// long as a serving certificate: renewals sign new serving certificates with the
// same CA (the caBundle does not change) until it would expire before the next
// one; a new CA then joins the bundle first, and signs only once published.
type generator struct {
	hosts    []string
	validity time.Duration
}

// publication is a caBundle and when it was written to the configurations.
type publication struct {
	bundle []byte
	at     time.Time
}

// Published records that the configurations now hold bundle (the Syncer wrote
// it): a new CA of it may sign serving certificates propagation later.
func (c *Certificates) Published(bundle []byte) {
	if cur := c.published.Load(); cur != nil && bytes.Equal(cur.bundle, bundle) {
		return
	}
	c.published.Store(&publication{bundle: append([]byte(nil), bundle...), at: time.Now()})
}

// GatePublication makes new CAs wait for Published before they sign (the webhook
// server's certificates; the metrics server's have no bundle to publish).
func (c *Certificates) GatePublication() { c.gated.Store(true) }

// mayUse tells whether the newest CA of bundle may sign serving certificates now.
func (c *Certificates) mayUse(bundle []byte, now time.Time) bool {
	if !c.gated.Load() {
		return true
	}
	p := c.published.Load()
	return p != nil && bytes.Equal(p.bundle, bundle) && !now.Before(p.at.Add(c.propagation))
}

// OnChange makes f be called after the certificate or the CA changed (read from
// the folder or the Secret, or renewed): the caBundle of the configurations must
// then be written again.
func (c *Certificates) OnChange(f func()) { c.onChange.Store(&f) }

// GenerateCertificates makes a CA and a serving certificate signed by it for the
// given DNS names and IP addresses (loopback is always included), valid one year
// and renewed by Run when a third of it is left.
func GenerateCertificates(hosts []string) (*Certificates, error) {
	return NewGeneratedCertificates(hosts, CertOptions{})
}

// NewGeneratedCertificates is GenerateCertificates with options.
func NewGeneratedCertificates(hosts []string, opts CertOptions) (*Certificates, error) {
	opts = opts.withDefaults()
	gen := &generator{hosts: hosts, validity: opts.Validity}
	certPEM, keyPEM, caPEM, caKeyPEM, err := gen.generate(time.Now())
	if err != nil {
		return nil, err
	}
	c := &Certificates{gen: gen, log: opts.Logger, propagation: propagationOf(opts.Validity)}
	st, err := stateFromPEM(certPEM, keyPEM, caPEM, caKeyPEM)
	if err != nil {
		return nil, err
	}
	c.state.Store(st)
	return c, nil
}

// propagationOf is how long a published caBundle is given to reach the API
// server before its new CA signs: a sixth of the validity, at most a minute (the
// serving certificate still has a third of its validity left then).
func propagationOf(validity time.Duration) time.Duration { return min(validity/6, time.Minute) }

// stateFromPEM parses a certificate, its key, the CA bundle and the key of its
// newest CA (optional).
func stateFromPEM(certPEM, keyPEM, caPEM, caKeyPEM []byte) (*certState, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	st := &certState{cert: &pair, ca: caPEM, leaf: leaf}
	if block, _ := pem.Decode(caKeyPEM); block != nil {
		if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
			st.caKey = k
		}
	}
	return st, nil
}

// generatePEM makes the PEM of a serving certificate, its key and its CA, valid a
// year.
func generatePEM(hosts []string) (certPEM, keyPEM, caPEM []byte, err error) {
	certPEM, keyPEM, caPEM, _, err = (&generator{hosts: hosts, validity: DefaultCertValidity}).generate(time.Now())
	return certPEM, keyPEM, caPEM, err
}

// backdate is how long before now a generated certificate starts being valid, for
// clocks a little behind: an hour, or a tenth of a short validity.
func backdate(validity time.Duration) time.Duration { return min(time.Hour, validity/10) }

// generate makes the PEM of a serving certificate, its key, its CA and the CA's key.
func (g *generator) generate(now time.Time) (certPEM, keyPEM, caPEM, caKeyPEM []byte, err error) {
	ca, caKey, caPEM, caKeyPEM, err := g.newCA(now)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	certPEM, keyPEM, err = g.sign(ca, caKey, now)
	return certPEM, keyPEM, caPEM, caKeyPEM, err
}

// newCA makes a CA valid twice the validity.
func (g *generator) newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "luaop webhook CA " + now.UTC().Format("20060102T150405.000")},
		NotBefore:             now.Add(-backdate(g.validity)),
		NotAfter:              now.Add(2 * g.validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	return ca, caKey, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// sign makes a serving certificate for the hosts, signed by ca.
func (g *generator) sign(ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "luaop webhook"},
		NotBefore:    now.Add(-backdate(g.validity)),
		NotAfter:     now.Add(g.validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	for _, h := range g.hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// renewed is the state after a renewal of st, or nil when none is due yet: a new
// serving certificate signed by the newest CA; first a new CA, joining the bundle,
// when the newest would expire before a new serving certificate (or its key is
// unknown); a new CA signs only once it may (mayUse).
func (c *Certificates) renewed(st *certState, now time.Time) (*certState, error) {
	if !renewalDue(st.leaf, now) {
		return nil, nil
	}
	newest := st.newestCA()
	issuedByNewest := newest != nil && bytes.Equal(st.leaf.RawIssuer, newest.RawSubject) && st.leaf.CheckSignatureFrom(newest) == nil
	if newest == nil || st.caKey == nil || (issuedByNewest && newest.NotAfter.Before(now.Add(c.gen.validity))) {
		_, caKey, caPEM, _, err := c.gen.newCA(now)
		if err != nil {
			return nil, err
		}
		next := *st
		next.ca, next.caKey = bundleWith(caPEM, st.ca, now), caKey
		return &next, nil // the same serving certificate, a bundle with the new CA
	}
	if !issuedByNewest && !c.mayUse(st.ca, now) {
		return nil, nil // the new CA is not trusted by the API server yet
	}
	certPEM, keyPEM, err := c.gen.sign(newest, st.caKey, now)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	newestPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: newest.Raw})
	return &certState{cert: &pair, leaf: leaf, ca: bundleWith(newestPEM, st.ca, now), caKey: st.caKey, version: st.version}, nil
}

// pemOf encodes a state's serving certificate, its key and its newest CA's key.
func pemOf(st *certState) (certPEM, keyPEM, caKeyPEM []byte, err error) {
	for _, der := range st.cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	key, ok := st.cert.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, nil, errors.New("the serving key is not an ECDSA key")
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	if st.caKey != nil {
		der, err := x509.MarshalECPrivateKey(st.caKey)
		if err != nil {
			return nil, nil, nil, err
		}
		caKeyPEM = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	return certPEM, keyPEM, caKeyPEM, nil
}

// renewalDue tells whether a certificate should be renewed: a third of its
// lifetime or less is left.
func renewalDue(leaf *x509.Certificate, now time.Time) bool {
	lifetime := leaf.NotAfter.Sub(leaf.NotBefore)
	return !now.Before(leaf.NotAfter.Add(-lifetime / 3))
}

// bundleWith is the caBundle after a renewal: the new CA, then the CAs of the
// previous bundle still valid (the replicas, and the API server's view of the
// configuration, switch at different times: each must trust both meanwhile). At
// most the new and one previous CA are kept.
func bundleWith(newCA, previous []byte, now time.Time) []byte {
	out := append([]byte(nil), bytes.TrimSpace(newCA)...)
	out = append(out, '\n')
	rest := previous
	for kept := 0; kept < 1; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil || !now.Before(cert.NotAfter) || bytes.Contains(newCA, pem.EncodeToMemory(block)) {
			continue
		}
		out = append(out, pem.EncodeToMemory(block)...)
		kept++
	}
	return out
}

// SecretCertificates reads the webhook's certificate from the kubernetes.io/tls
// Secret namespace/name (tls.crt, tls.key, ca.crt), generating it and creating the
// Secret when it does not exist: replicas of one operator then share one CA, so
// that the caBundle they write is the same. The first replica to create it wins;
// the others read it. Run renews it (updating the Secret) when a third of its
// validity is left, and picks up a renewal another replica made.
func SecretCertificates(ctx context.Context, client kubernetes.Interface, namespace, name string, hosts []string) (*Certificates, error) {
	return NewSecretCertificates(ctx, client, namespace, name, hosts, CertOptions{})
}

// secretSource is the Secret generated certificates are kept in.
type secretSource struct {
	client          kubernetes.Interface
	namespace, name string
}

// NewSecretCertificates is SecretCertificates with options.
func NewSecretCertificates(ctx context.Context, client kubernetes.Interface, namespace, name string, hosts []string, opts CertOptions) (*Certificates, error) {
	opts = opts.withDefaults()
	c := &Certificates{gen: &generator{hosts: hosts, validity: opts.Validity}, secret: &secretSource{client: client, namespace: namespace, name: name},
		log: opts.Logger, propagation: propagationOf(opts.Validity)}
	for attempt := 0; attempt < 2; attempt++ {
		st, err := c.readSecret(ctx)
		if err == nil {
			c.state.Store(st)
			return c, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
		certPEM, keyPEM, caPEM, caKeyPEM, err := c.gen.generate(time.Now())
		if err != nil {
			return nil, err
		}
		created, err := client.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
			Labels: map[string]string{ManagedByLabel: "luaop"}}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": caPEM, "ca.key": caKeyPEM}}, metav1.CreateOptions{})
		if err == nil {
			st, err := stateFromPEM(certPEM, keyPEM, caPEM, caKeyPEM)
			if err != nil {
				return nil, err
			}
			st.version = created.ResourceVersion
			c.state.Store(st)
			return c, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the webhook certificate Secret %s/%s: %w", namespace, name, err)
		}
	}
	return nil, fmt.Errorf("webhook certificate Secret %s/%s: created and deleted meanwhile", namespace, name)
}

// readSecret reads the certificates of the Secret (a NotFound error when missing).
func (c *Certificates) readSecret(ctx context.Context) (*certState, error) {
	s := c.secret
	sec, err := s.client.CoreV1().Secrets(s.namespace).Get(ctx, s.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("reading the webhook certificate Secret %s/%s: %w (the operator needs get on it)", s.namespace, s.name, err)
	}
	st, err := stateFromPEM(sec.Data["tls.crt"], sec.Data["tls.key"], sec.Data["ca.crt"], sec.Data["ca.key"])
	if err != nil || len(sec.Data["ca.crt"]) == 0 {
		return nil, fmt.Errorf("webhook certificate Secret %s/%s: needs tls.crt, tls.key and ca.crt (%v); delete it to have one generated", s.namespace, s.name, err)
	}
	st.version = sec.ResourceVersion
	return st, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// LoadCertificates reads tls.crt, tls.key and ca.crt (optional: without it the
// caBundle is tls.crt's chain, right for a self-signed certificate) from dir.
func LoadCertificates(dir string) (*Certificates, error) {
	c := &Certificates{dir: dir, log: slog.Default()}
	if _, err := c.reload(); err != nil {
		return nil, err
	}
	c.checked.Store(time.Now().UnixNano())
	return c, nil
}

// reload reads the folder again if a file changed, and tells whether the
// certificate or the CA changed. No lock is held: the files are read and parsed
// first, then the new state is swapped in.
func (c *Certificates) reload() (changed bool, err error) {
	crt, key, ca := filepath.Join(c.dir, "tls.crt"), filepath.Join(c.dir, "tls.key"), filepath.Join(c.dir, "ca.crt")
	var newest time.Time
	for _, p := range []string{crt, key, ca} {
		if st, err := os.Stat(p); err == nil && st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	old := c.state.Load()
	if old != nil && !newest.After(old.modTime) {
		return false, nil
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		return false, fmt.Errorf("webhook certificate in %s (tls.crt, tls.key): %w", c.dir, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return false, fmt.Errorf("webhook certificate in %s: %w", c.dir, err)
	}
	bundle, err := os.ReadFile(ca)
	if err != nil {
		if !os.IsNotExist(err) {
			return false, fmt.Errorf("webhook CA %s: %w", ca, err)
		}
		bundle, _ = os.ReadFile(crt)
	}
	bundle = append(bytes.TrimSpace(bundle), '\n')
	if old != nil {
		// The previous CA stays trusted while it is valid: replicas whose volume the
		// kubelet has not refreshed yet still serve leaves it signed (cert-manager
		// rotates a CA's key by default), and the API server must accept both.
		bundle = bundleWith(bundle, old.ca, time.Now())
	}
	c.state.Store(&certState{cert: &pair, ca: bundle, leaf: leaf, modTime: newest})
	return old != nil && (!bytes.Equal(old.ca, bundle) || !sameCertificate(old.cert, &pair)), nil
}

func sameCertificate(a, b *tls.Certificate) bool {
	if len(a.Certificate) != len(b.Certificate) {
		return false
	}
	for i := range a.Certificate {
		if !bytes.Equal(a.Certificate[i], b.Certificate[i]) {
			return false
		}
	}
	return true
}

// reloadEvery is how often at most the folder is looked at again.
const reloadEvery = 10 * time.Second

// maybeReload reads the folder again at most every reloadEvery, and calls the
// OnChange function when the certificate or the CA changed.
func (c *Certificates) maybeReload() {
	if c.dir == "" || time.Since(time.Unix(0, c.checked.Load())) < reloadEvery {
		return
	}
	if !c.reloading.CompareAndSwap(false, true) {
		return // another caller is reading the folder; serve the current pair
	}
	defer c.reloading.Store(false)
	c.checked.Store(time.Now().UnixNano())
	changed, err := c.reload() // an error: a half-written rotation, keep serving the previous pair
	if err == nil && changed {
		c.changed()
	}
}

func (c *Certificates) changed() {
	if f := c.onChange.Load(); f != nil {
		(*f)()
	}
}

// Rotate renews generated certificates when a third of their validity is left
// (in the Secret, when they are kept in one, taking up another replica's renewal
// instead when it came first), and reads a folder's again; it calls the OnChange
// function when the certificate or the CA changed. Run calls it periodically.
func (c *Certificates) Rotate(ctx context.Context) error {
	c.rotateMu.Lock()
	changed, err := c.rotate(ctx, time.Now())
	c.rotateMu.Unlock()
	if changed {
		c.changed()
	}
	return err
}

func (c *Certificates) rotate(ctx context.Context, now time.Time) (changed bool, err error) {
	cur := c.state.Load()
	switch {
	case c.dir != "":
		c.checked.Store(now.UnixNano())
		changed, err := c.reload()
		// A tenth of the lifetime left: past cert-manager's renewal (a third).
		if st := c.state.Load(); err == nil && !now.Before(st.leaf.NotAfter.Add(-st.leaf.NotAfter.Sub(st.leaf.NotBefore)/10)) {
			c.log.Warn("the webhook certificate expires soon and was not renewed: renew the files (cert-manager's Certificate, or the mounted Secret)",
				"dir", c.dir, "not_after", st.leaf.NotAfter.UTC().Format(time.RFC3339))
		}
		return changed, err
	case c.secret != nil:
		st, err := c.readSecret(ctx)
		if err != nil {
			return false, err
		}
		next, err := c.renewed(st, now)
		if err != nil {
			return false, err
		}
		if next != nil {
			written, err := c.writeSecret(ctx, next)
			if apierrors.IsConflict(err) {
				return false, nil // another replica renewed it: read at the next check
			}
			if err != nil {
				return false, err
			}
			st = written
		}
		if st.version == cur.version && sameCertificate(st.cert, cur.cert) && bytes.Equal(st.ca, cur.ca) {
			return false, nil
		}
		c.state.Store(st)
		return true, nil
	case c.gen != nil:
		next, err := c.renewed(cur, now)
		if err != nil || next == nil {
			return false, err
		}
		c.state.Store(next)
		c.logRenewal(cur, next, "")
		return true, nil
	}
	return false, nil
}

// logRenewal says what a renewal changed.
func (c *Certificates) logRenewal(prev, next *certState, secret string) {
	attrs := []any{"not_after", next.leaf.NotAfter.UTC().Format(time.RFC3339)}
	if secret != "" {
		attrs = append(attrs, "secret", secret)
	}
	if sameCertificate(prev.cert, next.cert) {
		c.log.Info("webhook CA renewed: the new CA is published in the caBundle, and signs the next serving certificate", attrs...)
		return
	}
	c.log.Info("webhook certificate renewed", attrs...)
}

// writeSecret writes a renewed state into the Secret, over the version read.
func (c *Certificates) writeSecret(ctx context.Context, next *certState) (*certState, error) {
	certPEM, keyPEM, caKeyPEM, err := pemOf(next)
	if err != nil {
		return nil, err
	}
	s := c.secret
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.namespace, ResourceVersion: next.version,
		Labels: map[string]string{ManagedByLabel: "luaop"}}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": next.ca, "ca.key": caKeyPEM}}
	updated, err := s.client.CoreV1().Secrets(s.namespace).Update(ctx, sec, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			return nil, err
		}
		return nil, fmt.Errorf("renewing the webhook certificate in the Secret %s/%s: %w (the operator needs update on it)", s.namespace, s.name, err)
	}
	written := *next
	written.version = updated.ResourceVersion
	c.logRenewal(c.state.Load(), &written, s.namespace+"/"+s.name)
	return &written, nil
}

// checkEvery is how often Run looks at the certificates: a tenth of their
// lifetime, at most a minute, at least 100ms.
func (c *Certificates) checkEvery() time.Duration {
	st := c.state.Load()
	every := time.Minute
	if st != nil && st.leaf != nil {
		every = min(every, st.leaf.NotAfter.Sub(st.leaf.NotBefore)/10)
	}
	return max(every, 100*time.Millisecond)
}

// Run rotates the certificates (Rotate) at once (a start on a certificate already
// due, kept in the Secret while the operator was down) and then periodically,
// until ctx ends. Errors are logged and tried again at the next check: the current
// certificate keeps serving.
func (c *Certificates) Run(ctx context.Context) {
	for {
		if err := c.Rotate(ctx); err != nil && !errors.Is(err, context.Canceled) {
			c.log.Error("checking the webhook certificate; retrying", "error", err)
		}
		t := time.NewTimer(c.checkEvery())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// GetCertificate serves tls.Config.GetCertificate.
func (c *Certificates) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.maybeReload()
	return c.state.Load().cert, nil
}

// CABundle is the PEM of the CA the API server must trust.
func (c *Certificates) CABundle() []byte {
	c.maybeReload()
	return append([]byte(nil), c.state.Load().ca...)
}

// NotAfter is when the certificate served now expires.
func (c *Certificates) NotAfter() time.Time { return c.state.Load().leaf.NotAfter }
