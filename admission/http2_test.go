package admission

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"
)

// The webhook server speaks HTTP/1.1 only unless EnableHTTP2 (--enable-http2): a
// client offering HTTP/2 gets HTTP/1.1, as from kubebuilder's scaffold since the
// 2023 HTTP/2 rapid-reset advisories.
func TestWebhookServerSpeaksHTTP2OnlyWhenEnabled(t *testing.T) {
	for _, tc := range []struct {
		enable bool
		want   string
	}{{false, "HTTP/1.1"}, {true, "HTTP/2.0"}} {
		w, _ := startOnFakeAPI(t, Options{EnableHTTP2: tc.enable}, nil, time.Hour)
		if got := protoOf(t, "https://"+w.Addr().String()+probePath); got != tc.want {
			t.Errorf("EnableHTTP2=%v: a client offering HTTP/2 was served %s, want %s", tc.enable, got, tc.want)
		}
	}
}

// protoOf is the protocol a client that offers HTTP/2 (and HTTP/1.1) is served at url.
func protoOf(t *testing.T, url string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test's own self-signed certificate
		ForceAttemptHTTP2: true,
	}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			return resp.Proto
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
