package admission

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// Where the API server is told to call the webhooks, and when it cannot.
func TestWebhooksClientConfig(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		opts       Options
		url        string
		service    bool
		unreach    string
	}{
		{name: "local control plane", host: "https://127.0.0.1:6443", url: "https://127.0.0.1:"},
		{name: "remote cluster, loopback", host: "https://10.1.2.3:6443", url: "https://127.0.0.1:",
			unreach: "the cluster at https://10.1.2.3:6443 is not on this machine and cannot call the webhook"},
		{name: "remote cluster, url", host: "https://10.1.2.3:6443", opts: Options{URL: "https://tunnel.example.com:8443"},
			url: "https://tunnel.example.com:8443/validate/x"},
		{name: "in cluster", host: "https://10.1.2.3:6443", opts: Options{Service: "ops/hooks", DryRun: true}, service: true,
			unreach: "dry run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Address = "127.0.0.1:0"
			w, err := New(&rest.Config{Host: tc.host}, nil, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer w.ln.Close()
			if got := w.URL("/validate/x"); !strings.HasPrefix(got, tc.url) || (tc.service && got != "") {
				t.Errorf("URL = %q, want %q...", got, tc.url)
			}
			cc := w.syncer.ClientConfig("/validate/x")
			if tc.service && (cc.Service == nil || cc.Service.Namespace != "ops" || *cc.Service.Path != "/validate/x" || *cc.Service.Port != 443) {
				t.Errorf("service client config %+v", cc.Service)
			}
			if tc.unreach == "" && w.Unreachable() != "" || !strings.Contains(w.Unreachable(), tc.unreach) {
				t.Errorf("Unreachable() = %q, want %q", w.Unreachable(), tc.unreach)
			}
		})
	}
}
