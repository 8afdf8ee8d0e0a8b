package main

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/testcluster"
)

// /metrics with --metrics-secure (luaop run's default), against the real API
// server: HTTPS, and only a bearer token the API server authenticates (TokenReview)
// and authorizes for get on /metrics (SubjectAccessReview) is answered, as
// controller-runtime's secure metrics and a Prometheus with a ServiceAccount
// token expect.
func TestSecureMetricsAuthenticatesAndAuthorizes(t *testing.T) {
	env, _ := exampleCluster(t)
	ns := env.Namespace(t)
	ctx := t.Context()
	token := func(sa string) string {
		t.Helper()
		if _, err := env.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := env.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a token of %s: %v", sa, err)
		}
		return tr.Status.Token
	}
	scraper, stranger := token("scraper"), token("stranger")
	// The reader role deploy/components/prometheus grants Prometheus.
	role := "luaop-metrics-reader-" + ns
	if _, err := env.Kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.RbacV1().ClusterRoles().Delete(ctx, role, metav1.DeleteOptions{}) })
	if _, err := env.Kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Kube.RbacV1().ClusterRoleBindings().Delete(ctx, role, metav1.DeleteOptions{}) })

	addr := freeAddress(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	m := metrics.New()
	m.BuildInfo("v-secure-test")
	if err := serveEndpoints(ctx, log, settings{MetricsAddress: addr, MetricsSecure: true}, nil, m, nil, nil, nil, env.Kube, nil); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a self-signed certificate, as Prometheus' insecureSkipVerify
	get := func(scheme, bearer string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+"/metrics", nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testcluster.Eventually(t, 10*time.Second, func() (bool, string) {
		code, body := get("https", "")
		return code == http.StatusUnauthorized, body
	})
	if code, body := get("https", "not-a-token"); code != http.StatusUnauthorized {
		t.Errorf("a bad token: %d %s, want 401", code, body)
	}
	if code, body := get("https", stranger); code != http.StatusForbidden || !strings.Contains(body, "may not get /metrics") {
		t.Errorf("an authenticated user without the role: %d %s, want 403", code, body)
	}
	if code, body := get("https", scraper); code != http.StatusOK || !strings.Contains(body, `luaop_build_info{goversion=`) {
		t.Errorf("the scraper: %d %.200s, want 200 and the metrics", code, body)
	} else if !strings.Contains(body, `luaop_certificate_expiry_timestamp_seconds{certificate="metrics"} `) {
		t.Errorf("/metrics does not say when its own certificate expires:\n%s", body)
	}
	if code, _ := get("http", scraper); code == http.StatusOK {
		t.Error("/metrics answered plain HTTP with --metrics-secure")
	}
}

// /debug and Go's profiles (object names, handler messages, memory) answer loopback
// clients only (kubectl port-forward arrives on the pod's loopback); the probes
// answer anyone (the kubelet).
func TestDebugAnswersLoopbackOnly(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := loopbackOnly(ok, "/debug")
	for _, tt := range []struct {
		remote, path string
		code         int
	}{
		{"127.0.0.1:40000", "/debug", http.StatusOK},
		{"[::1]:40000", "/debug/pprof/heap", http.StatusOK},
		{"198.18.0.7:40000", "/debug", http.StatusForbidden},
		{"198.18.0.7:40000", "/debug/pprof/heap", http.StatusForbidden},
		{"198.18.0.7:40000", "/healthz", http.StatusOK},
		{"198.18.0.7:40000", "/readyz", http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodGet, tt.path, nil)
		req.RemoteAddr = tt.remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tt.code {
			t.Errorf("%s from %s: %d, want %d", tt.path, tt.remote, rec.Code, tt.code)
		}
	}
}
