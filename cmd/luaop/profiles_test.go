package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// --profiles serves profiles go tool pprof reads (gzipped protobuf), and a bad
// duration is refused with what to give instead.
func TestProfilesAreServed(t *testing.T) {
	mux := http.NewServeMux()
	serveProfiles(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for _, path := range []string{"/debug/pprof/heap", "/debug/pprof/allocs", "/debug/pprof/goroutine", "/debug/pprof/profile?seconds=1"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
		if _, err := gzip.NewReader(bytes.NewReader(body)); err != nil {
			t.Errorf("%s: not a gzipped profile (%d bytes): %v", path, len(body), err)
		}
	}
	resp, err := http.Get(srv.URL + "/debug/pprof/profile?seconds=forever")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(body, []byte("1 to 300")) {
		t.Errorf("seconds=forever: %d %q, want 400 saying what to give", resp.StatusCode, body)
	}
}
