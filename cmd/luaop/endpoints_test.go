package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/luaop/luaop/metrics"
)

// An address of /healthz or /metrics luaop cannot listen on is an error of the start
// naming the address and the flag, not a log line with the endpoint silently off.
func TestEndpointsThatCannotListenFailTheStart(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tests := []struct {
		name            string
		health, metrics string
		want            []string
	}{
		{"health address taken", addr, "", []string{"--health-address=" + addr, "/healthz", "give another --health-address"}},
		{"metrics address taken", "127.0.0.1:0", addr, []string{"--metrics-address=" + addr, "/metrics", "give another --metrics-address"}},
		{"one server for both, taken", addr, addr, []string{"--health-address=" + addr}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			err := serveEndpoints(ctx, log, settings{HealthAddress: tt.health, MetricsAddress: tt.metrics}, nil, metrics.New(), nil, nil, nil, nil, nil)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// A free address is listened on before serveEndpoints returns.
func TestEndpointsServeMetrics(t *testing.T) {
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String()
	free.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := serveEndpoints(ctx, log, settings{MetricsAddress: addr}, nil, metrics.New(), nil, nil, nil, nil, nil); err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/metrics: status %d", resp.StatusCode)
	}
}
