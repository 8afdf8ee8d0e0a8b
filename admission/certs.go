package admission

import (
	"bytes"
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
	"sync"
	"time"
)

// Certificates serve the webhook's TLS: from a folder (tls.crt, tls.key and, when
// present, ca.crt: what cert-manager or a mounted kubernetes.io/tls Secret
// provide), read again when the files change, or generated at start.
type Certificates struct {
	dir string

	mu      sync.Mutex // guards the fields below (a leaf lock)
	cert    *tls.Certificate
	ca      []byte // PEM of the CA that signed cert (the caBundle)
	modTime time.Time
	checked time.Time
}

// GenerateCertificates makes a CA and a serving certificate signed by it for the
// given DNS names and IP addresses (loopback is always included), valid one year.
func GenerateCertificates(hosts []string) (*Certificates, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
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
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &Certificates{cert: &pair, ca: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

// LoadCertificates reads tls.crt, tls.key and ca.crt (optional: without it the
// caBundle is tls.crt's chain, right for a self-signed certificate) from dir.
func LoadCertificates(dir string) (*Certificates, error) {
	c := &Certificates{dir: dir}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the folder again if a file changed. c.mu held by the caller or not
// yet shared.
func (c *Certificates) reload() error {
	crt, key, ca := filepath.Join(c.dir, "tls.crt"), filepath.Join(c.dir, "tls.key"), filepath.Join(c.dir, "ca.crt")
	var newest time.Time
	for _, p := range []string{crt, key, ca} {
		if st, err := os.Stat(p); err == nil && st.ModTime().After(newest) {
			newest = st.ModTime()
		}
	}
	if c.cert != nil && !newest.After(c.modTime) {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		return fmt.Errorf("webhook certificate in %s (tls.crt, tls.key): %w", c.dir, err)
	}
	bundle, err := os.ReadFile(ca)
	if err != nil {
		if !os.IsNotExist(err) {
			return fmt.Errorf("webhook CA %s: %w", ca, err)
		}
		bundle, _ = os.ReadFile(crt)
	}
	c.cert, c.ca, c.modTime = &pair, bytes.TrimSpace(bundle), newest
	c.ca = append(c.ca, '\n')
	return nil
}

// maybeReload reads the folder again at most every 10 seconds.
func (c *Certificates) maybeReload() {
	if c.dir == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) < 10*time.Second {
		return
	}
	c.checked = time.Now()
	_ = c.reload() // a half-written rotation: keep serving the previous pair
}

// GetCertificate serves tls.Config.GetCertificate.
func (c *Certificates) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.maybeReload()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cert, nil
}

// CABundle is the PEM of the CA the API server must trust.
func (c *Certificates) CABundle() []byte {
	c.maybeReload()
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.ca...)
}
