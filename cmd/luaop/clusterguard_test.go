package main

import (
	"strings"
	"testing"
)

// The rule of luaop dev's guard against shared clusters.
func TestDevAllowedOnLocalClustersOnly(t *testing.T) {
	remote := "https://10.20.30.40:6443"
	for _, tc := range []struct {
		name     string
		target   clusterTarget
		explicit string
		allowed  []string
		ok       bool
	}{
		{name: "kind", target: clusterTarget{Context: "kind-dev", Server: "https://127.0.0.1:38093", OnThisMachine: true}, ok: true},
		{name: "kind context on another machine's docker", target: clusterTarget{Context: "kind-ci", Server: "https://192.168.1.9:6443"}, ok: true},
		{name: "k3d", target: clusterTarget{Context: "k3d-mycluster", Server: remote}, ok: true},
		{name: "minikube", target: clusterTarget{Context: "minikube", Server: "https://192.168.49.2:8443"}, ok: true},
		{name: "docker-desktop", target: clusterTarget{Context: "docker-desktop", Server: "https://kubernetes.docker.internal:6443"}, ok: true},
		{name: "a server on this machine", target: clusterTarget{Context: "whatever", Server: "https://127.0.0.1:6443", OnThisMachine: true}, ok: true},
		{name: "a shared cluster", target: clusterTarget{Context: "prod-eu", Server: remote}},
		{name: "a shared cluster named with --context", target: clusterTarget{Context: "prod-eu", Server: remote}, explicit: "prod-eu", ok: true},
		{name: "a shared cluster allowed", target: clusterTarget{Context: "staging", Server: remote}, allowed: []string{"dev", "staging"}, ok: true},
		{name: "another context allowed", target: clusterTarget{Context: "prod-eu", Server: remote}, allowed: []string{"staging"}},
		{name: "kind-like but not kind", target: clusterTarget{Context: "mykind-prod", Server: remote}},
		{name: "in-cluster config, remote", target: clusterTarget{Server: remote}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := devAllowed(tc.target, tc.explicit, tc.allowed)
			if (err == nil) != tc.ok {
				t.Fatalf("devAllowed = %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				for _, part := range []string{tc.target.Server, "not a local one", "--context", "--allow-context"} {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("the error does not say %q: %v", part, err)
					}
				}
			}
		})
	}
}
