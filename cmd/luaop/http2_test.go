package main

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// /metrics over HTTPS (--metrics-secure) speaks HTTP/1.1 only unless
// --enable-http2, like the webhook server.
func TestSecureMetricsSpeakHTTP2OnlyWhenEnabled(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		enable bool
		want   string
	}{{false, "HTTP/1.1"}, {true, "HTTP/2.0"}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		secure, err := secureListener(t.Context(), ln, "", tc.enable, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		go serve(t.Context(), log, "metrics", secure, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a self-signed certificate
			ForceAttemptHTTP2: true,
		}}
		resp, err := client.Get("https://" + ln.Addr().String() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.Proto != tc.want {
			t.Errorf("--enable-http2=%v: a client offering HTTP/2 was served %s, want %s", tc.enable, resp.Proto, tc.want)
		}
	}
}
