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
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Certificates serve the webhook's TLS: from a folder (tls.crt, tls.key and, when
// present, ca.crt: what cert-manager or a mounted kubernetes.io/tls Secret
// provide), read again when the files change, or generated at start.
type Certificates struct {
	dir string

	state     atomic.Pointer[certState]
	checked   atomic.Int64 // when the folder was last looked at (UnixNano)
	reloading atomic.Bool  // one reader of the folder at a time
	// onChange is called (without any lock held) after a reload changed the
	// certificate or the CA; set by OnChange before serving.
	onChange atomic.Pointer[func()]
}

// certState is one certificate and its CA, swapped as a whole.
type certState struct {
	cert    *tls.Certificate
	ca      []byte // PEM of the CA that signed cert (the caBundle)
	modTime time.Time
}

// OnChange makes f be called after the certificate or the CA read from the folder
// changed (the caBundle of the configurations must then be written again).
func (c *Certificates) OnChange(f func()) { c.onChange.Store(&f) }

// GenerateCertificates makes a CA and a serving certificate signed by it for the
// given DNS names and IP addresses (loopback is always included), valid one year.
func GenerateCertificates(hosts []string) (*Certificates, error) {
	certPEM, keyPEM, caPEM, err := generatePEM(hosts)
	if err != nil {
		return nil, err
	}
	return certificatesFromPEM(certPEM, keyPEM, caPEM)
}

// certificatesFromPEM makes fixed Certificates of PEM data.
func certificatesFromPEM(certPEM, keyPEM, caPEM []byte) (*Certificates, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	c := &Certificates{}
	c.state.Store(&certState{cert: &pair, ca: caPEM})
	return c, nil
}

// generatePEM makes the PEM of a serving certificate, its key and its CA.
func generatePEM(hosts []string) (certPEM, keyPEM, caPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "luaop webhook CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "luaop webhook"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		DNSNames:     []string{"localhost"},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// SecretCertificates reads the webhook's certificate from the kubernetes.io/tls
// Secret namespace/name (tls.crt, tls.key, ca.crt), generating it and creating the
// Secret when it does not exist: replicas of one operator then share one CA, so
// that the caBundle they write is the same. The first replica to create it wins;
// the others read it.
func SecretCertificates(ctx context.Context, client kubernetes.Interface, namespace, name string, hosts []string) (*Certificates, error) {
	api := client.CoreV1().Secrets(namespace)
	for attempt := 0; attempt < 2; attempt++ {
		sec, err := api.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			c, err := certificatesFromPEM(sec.Data["tls.crt"], sec.Data["tls.key"], sec.Data["ca.crt"])
			if err != nil || len(sec.Data["ca.crt"]) == 0 {
				return nil, fmt.Errorf("webhook certificate Secret %s/%s: needs tls.crt, tls.key and ca.crt (%v); delete it to have one generated", namespace, name, err)
			}
			return c, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading the webhook certificate Secret %s/%s: %w (the operator needs get and create on secrets in its namespace)", namespace, name, err)
		}
		certPEM, keyPEM, caPEM, err := generatePEM(hosts)
		if err != nil {
			return nil, err
		}
		_, err = api.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace,
			Labels: map[string]string{ManagedByLabel: "luaop"}}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM, "ca.crt": caPEM}}, metav1.CreateOptions{})
		if err == nil {
			return certificatesFromPEM(certPEM, keyPEM, caPEM)
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the webhook certificate Secret %s/%s: %w", namespace, name, err)
		}
	}
	return nil, fmt.Errorf("webhook certificate Secret %s/%s: created and deleted meanwhile", namespace, name)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// LoadCertificates reads tls.crt, tls.key and ca.crt (optional: without it the
// caBundle is tls.crt's chain, right for a self-signed certificate) from dir.
func LoadCertificates(dir string) (*Certificates, error) {
	c := &Certificates{dir: dir}
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
	bundle, err := os.ReadFile(ca)
	if err != nil {
		if !os.IsNotExist(err) {
			return false, fmt.Errorf("webhook CA %s: %w", ca, err)
		}
		bundle, _ = os.ReadFile(crt)
	}
	bundle = append(bytes.TrimSpace(bundle), '\n')
	c.state.Store(&certState{cert: &pair, ca: bundle, modTime: newest})
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
		if f := c.onChange.Load(); f != nil {
			(*f)()
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
