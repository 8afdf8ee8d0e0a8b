package main

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// requestStats counts the API requests of the in-process operator by kind (verb and
// subresource) with their latencies: where its wall time goes, seen from the client.
type requestStats struct {
	mu    sync.Mutex
	kinds map[string]*requestKind
}

type requestKind struct {
	count int
	total time.Duration
	lat   []time.Duration
}

func newRequestStats() *requestStats { return &requestStats{kinds: map[string]*requestKind{}} }

func (s *requestStats) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		d := time.Since(start)
		kind := req.Method + " " + requestShape(req)
		if req.URL.Query().Get("watch") == "true" {
			kind += " (watch: time to headers)"
		}
		s.mu.Lock()
		k := s.kinds[kind]
		if k == nil {
			k = &requestKind{}
			s.kinds[kind] = k
		}
		k.count++
		k.total += d
		k.lat = append(k.lat, d)
		s.mu.Unlock()
		return resp, err
	})
}

// requestShape reduces a path to its shape: names replaced, subresource kept.
func requestShape(req *http.Request) string {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	// /apis/<group>/<version>/namespaces/<ns>/<resource>[/<name>[/<sub>]]
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			rest := parts[i+2:]
			switch len(rest) {
			case 1:
				return rest[0]
			case 2:
				return rest[0] + "/{name}"
			default:
				return rest[0] + "/{name}/" + strings.Join(rest[2:], "/")
			}
		}
	}
	return req.URL.Path
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (s *requestStats) reset() {
	s.mu.Lock()
	s.kinds = map[string]*requestKind{}
	s.mu.Unlock()
}

func (s *requestStats) report() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.kinds))
	for k := range s.kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v := s.kinds[k]
		lat := append([]time.Duration(nil), v.lat...)
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		fmt.Fprintf(&b, "  %-60s %6d requests, mean %s, p50 %s, p99 %s, total %s\n", k, v.count,
			ms(v.total/time.Duration(max(v.count, 1))), ms(percentile(lat, 0.5)), ms(percentile(lat, 0.99)), secs(v.total))
	}
	return b.String()
}
