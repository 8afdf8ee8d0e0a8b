package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// certificatesCollector serves luaop_certificate_expiry_timestamp_seconds: when each
// serving certificate of the operator (the webhook server's, the secure metrics
// server's) expires, read at each scrape, so that a certificate luaop failed to
// renew (or one cert-manager did not) alerts before the API server refuses it.
type certificatesCollector struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	// notAfter is read at each scrape; each function must be cheap and safe to
	// call from the scrape's goroutine.
	notAfter map[string]func() time.Time
}

func newCertificatesCollector() *certificatesCollector {
	return &certificatesCollector{
		desc: prometheus.NewDesc("luaop_certificate_expiry_timestamp_seconds",
			"When a serving certificate of the operator expires (Unix seconds), by certificate: webhook, metrics. "+
				"luaop renews the certificates it generates when a third of their validity is left.",
			[]string{"certificate"}, nil),
		notAfter: map[string]func() time.Time{},
	}
}

func (c *certificatesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *certificatesCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	funcs := make(map[string]func() time.Time, len(c.notAfter))
	for name, f := range c.notAfter {
		funcs[name] = f
	}
	c.mu.Unlock()
	for name, f := range funcs { // called without the lock: f is the caller's
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(f().UnixNano())/1e9, name)
	}
}

// Certificate makes luaop_certificate_expiry_timestamp_seconds{certificate=name}
// report notAfter, read at each scrape.
func (m *Metrics) Certificate(name string, notAfter func() time.Time) {
	m.certificates.mu.Lock()
	defer m.certificates.mu.Unlock()
	m.certificates.notAfter[name] = notAfter
}
