package admission

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/rest"
)

// clientCA is a CA and a client certificate it signed, for the API server's side.
func clientCA(t *testing.T, cn string) (caPEM []byte, client tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test client CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageCertSign,
		BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(0xF019), Subject: pkix.Name{CommonName: cn, Organization: []string{"system:masters"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, DNSNames: []string{"apiserver.local"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	client, err = tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), client
}

// kopf's headers and sslpeer: admission handlers see the request's HTTP headers,
// and the client's certificate when it gave one the --webhook-client-ca CAs verify
// (kopf's WebhookServer(cafile=...)); a client without one is served, with
// ctx.sslpeer nil; one with a certificate of another CA is refused at the handshake.
func TestAdmissionHandlersSeeHeadersAndTheVerifiedPeer(t *testing.T) {
	caPEM, apiserver := clientCA(t, "kube-apiserver")
	_, stranger := clientCA(t, "someone else")
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	rt := testRuntime(t, `
local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx)
  table.insert(ctx.warnings, "agent: " .. ctx.headers["User-Agent"])
  if ctx.sslpeer == nil then
    table.insert(ctx.warnings, "peer: none")
  else
    local p = ctx.sslpeer
    table.insert(ctx.warnings, "peer: " .. p.subject.commonName .. " of " .. p.subject.organizationName[1] ..
      ", issued by " .. p.issuer.commonName .. ", serial " .. p.serialNumber .. ", " .. p.subjectAltName[1][1] .. " " .. p.subjectAltName[1][2])
  end
end, {id = "auth"})
`)
	w, err := New(&rest.Config{Host: "https://127.0.0.1:6443"}, rt, Options{Address: "127.0.0.1:0", ClientCA: caFile,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// Served as Start serves it (its TLS configuration), without the syncing.
	srv := &http.Server{Handler: w.server, TLSConfig: w.tlsConfig(), ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.ServeTLS(w.ln, "", "") }()
	defer srv.Close()
	url := "https://" + w.ln.Addr().String()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(w.certs.CABundle())
	call := func(cert *tls.Certificate) ([]string, error) {
		cfg := &tls.Config{RootCAs: roots}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		body, _ := json.Marshal(admissionv1.AdmissionReview{Request: request("CREATE", widget(`{}`))})
		req, _ := http.NewRequest(http.MethodPost, url+"/validate/auth", bytes.NewReader(body))
		req.Header.Set("User-Agent", "kube-apiserver-admission")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var review admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&review); err != nil {
			return nil, err
		}
		return review.Response.Warnings, nil
	}
	got, err := call(&apiserver)
	want := "agent: kube-apiserver-admission|peer: kube-apiserver of system:masters, issued by test client CA, serial F019, DNS apiserver.local"
	if err != nil || strings.Join(got, "|") != want {
		t.Errorf("with the API server's certificate: %q, %v; want %q", got, err, want)
	}
	if got, err := call(nil); err != nil || strings.Join(got, "|") != "agent: kube-apiserver-admission|peer: none" {
		t.Errorf("without a certificate: %q, %v", got, err)
	}
	if _, err := call(&stranger); err == nil {
		t.Error("a certificate of another CA was accepted")
	}
}
