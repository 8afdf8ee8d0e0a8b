package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/testcluster"
)

// The scripts' on.probe handlers decide readiness, not liveness: a failing one takes
// the pod out of the Services (503 on /readyz) and the kubelet does not restart it
// (200 on /healthz); with --probes-affect-liveness they decide /healthz too (kopf's
// liveness probes).
func TestProbesDecideReadinessAndLivenessWhenAsked(t *testing.T) {
	env, _ := exampleCluster(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.lua"), []byte(`local luaop = require("luaop")
luaop.on.probe(function(ctx) error("the backend does not answer") end, {id = "backend"})
`), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeconfig := os.Getenv("LUAOP_TEST_KUBECONFIG")
	for _, liveness := range []bool{false, true} {
		t.Run(fmt.Sprintf("probes-affect-liveness=%v", liveness), func(t *testing.T) {
			ns := env.Namespace(t)
			addr := freeAddress(t)
			logOutput = io.Discard
			t.Cleanup(func() { logOutput = os.Stderr })
			s, err := parseSettings(t, "--kubeconfig", kubeconfig, "--namespaces", ns, "--health-address", addr, "--metrics-address", "",
				"--post-events=false", fmt.Sprintf("--probes-affect-liveness=%v", liveness))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- runOperator(ctx, s, dir, false) }()
			t.Cleanup(func() { cancel(); <-done })
			get := func(path string) (int, string) {
				resp, err := http.Get("http://" + addr + path)
				if err != nil {
					return 0, err.Error()
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, string(b)
			}
			testcluster.Eventually(t, 20*time.Second, func() (bool, string) {
				code, body := get("/readyz")
				return code == http.StatusServiceUnavailable && strings.Contains(body, "the backend does not answer"), fmt.Sprintf("/readyz: %d %s", code, body)
			})
			code, body := get("/healthz")
			want := http.StatusOK
			if liveness {
				want = http.StatusInternalServerError
			}
			if code != want {
				t.Errorf("/healthz: %d %s, want %d", code, body, want)
			}
		})
	}
}
