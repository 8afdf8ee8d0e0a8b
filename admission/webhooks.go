package admission

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/luabind"
)

// Options configure Webhooks.
type Options struct {
	// Address is where the HTTPS server listens (":9443", "127.0.0.1:0").
	Address string
	// CertDir holds tls.crt, tls.key and optionally ca.crt; empty: a CA and a
	// serving certificate are generated at start (with Service, kept in the Secret
	// "<service name>-tls" of the Service's namespace, shared by the replicas).
	CertDir string
	// Service ("namespace/name") makes the API server call the webhook through that
	// Service (in-cluster), on ServicePort (default 443). Empty: URL.
	Service     string
	ServicePort int32
	// URL is the base URL the API server calls ("https://host:port"); empty means
	// https://127.0.0.1:<listening port>, right for a control plane on this machine.
	URL string
	// Prefix names the configurations (the operator's --prefix).
	Prefix string
	// RemoveOnExit deletes the configurations when Start returns (luaop dev: a
	// webhook nobody answers would reject every request it covers).
	RemoveOnExit bool
	// DryRun serves the handlers but writes no configuration (luaop run --dry-run).
	DryRun bool
	// Namespaces are the operator's --namespaces (see Syncer.Namespaces).
	Namespaces []string
	Logger     *slog.Logger
	// CertValidity is how long a generated certificate is valid (default one
	// year); it is renewed, without a restart, when a third of it is left.
	CertValidity time.Duration
	// Observer, when set, is told about every request (controller-runtime's
	// webhook metrics).
	Observer RequestObserver
}

// RequestObserver is told about the admission requests served, by webhook path
// (the handler's path, "unknown" for one no handler serves): metrics.Metrics
// implements it with controller_runtime_webhook_requests_total, _latency_seconds
// and _requests_in_flight. Its methods must return quickly.
type RequestObserver interface {
	WebhookStarted(webhook string)
	WebhookFinished(webhook string, code int, d time.Duration)
}

// Webhooks runs the admission server and keeps the configurations in sync.
type Webhooks struct {
	opts   Options
	cfg    *rest.Config
	server *Server
	certs  *Certificates
	syncer *Syncer
	ln     net.Listener
	log    *slog.Logger
	// unreachable explains why the API server cannot call this operator (a remote
	// cluster and a loopback URL): configurations are then not written.
	unreachable string

	trigger chan struct{}
	// resyncEvery overrides the package's resyncEvery (tests).
	resyncEvery time.Duration
	serving     atomic.Bool
	synced      atomic.Bool
}

// New listens on opts.Address and prepares the certificates and the syncer;
// nothing is served until Start. rt serves the Lua handlers (nil: Go ones only).
func New(cfg *rest.Config, rt *luabind.Runtime, opts Options) (*Webhooks, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ServicePort == 0 {
		opts.ServicePort = 443
	}
	w := &Webhooks{opts: opts, cfg: cfg, log: opts.Logger, trigger: make(chan struct{}, 1)}
	var svcNS, svcName string
	if opts.Service != "" {
		var ok bool
		svcNS, svcName, ok = strings.Cut(opts.Service, "/")
		if !ok || svcNS == "" || svcName == "" {
			return nil, fmt.Errorf("--webhook-service=%q: write it as namespace/name", opts.Service)
		}
	}
	var base *url.URL
	if opts.URL != "" {
		u, err := url.Parse(opts.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return nil, fmt.Errorf("--webhook-url=%q: give an https URL (https://host:port)", opts.URL)
		}
		base = u
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	var hosts []string
	if svcName != "" {
		hosts = append(hosts, svcName+"."+svcNS+".svc", svcName+"."+svcNS+".svc.cluster.local", svcName+"."+svcNS)
	}
	if base != nil {
		hosts = append(hosts, base.Hostname())
	}
	switch {
	case opts.CertDir != "":
		if w.certs, err = LoadCertificates(opts.CertDir); err != nil {
			return nil, err
		}
	case svcName != "" && !opts.DryRun:
		// Replicas share one generated CA through a Secret.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		w.certs, err = NewSecretCertificates(ctx, client, svcNS, svcName+"-tls", hosts, CertOptions{Validity: opts.CertValidity, Logger: opts.Logger})
		cancel()
		if err != nil {
			return nil, err
		}
	default:
		if w.certs, err = NewGeneratedCertificates(hosts, CertOptions{Validity: opts.CertValidity, Logger: opts.Logger}); err != nil {
			return nil, fmt.Errorf("generating the webhook certificate: %w", err)
		}
	}
	if w.ln, err = net.Listen("tcp", opts.Address); err != nil {
		return nil, fmt.Errorf("webhook server: cannot listen on %s: %w", opts.Address, err)
	}
	if base == nil && svcName == "" {
		port := w.ln.Addr().(*net.TCPAddr).Port
		host := "127.0.0.1"
		if h, _, err := net.SplitHostPort(opts.Address); err == nil && h != "" && !isUnspecified(h) {
			host = h
		}
		base = &url.URL{Scheme: "https", Host: net.JoinHostPort(host, strconv.Itoa(port))}
		if !isLoopbackHost(host) || !serverOnLoopback(cfg) {
			if isLoopbackHost(host) {
				w.unreachable = fmt.Sprintf("the cluster at %s is not on this machine and cannot call the webhook at %s: give --webhook-url (an https address the API server reaches) or --webhook-service (in-cluster); the validate and mutate handlers are not registered with the API server", cfg.Host, base)
			}
		}
	}
	if opts.DryRun {
		w.unreachable = "dry run: the webhook configurations are not written"
	}
	if w.unreachable == "" {
		// A renewed CA signs only once the configurations carry it.
		w.certs.GatePublication()
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	// A rotated certificate or CA (renewed, or read from --webhook-cert-dir or the
	// Secret) must reach the caBundle.
	w.certs.OnChange(w.Resync)
	w.server = NewServer(rt, opts.Logger)
	w.syncer = &Syncer{Client: client, Discovery: disco, Prefix: opts.Prefix, CABundle: w.certs.CABundle, Log: opts.Logger, Namespaces: opts.Namespaces,
		ClientConfig: func(path string) admissionregistrationv1.WebhookClientConfig {
			if svcName != "" {
				port := opts.ServicePort
				return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
					Namespace: svcNS, Name: svcName, Path: &path, Port: &port}}
			}
			u := strings.TrimSuffix(base.String(), "/") + path
			return admissionregistrationv1.WebhookClientConfig{URL: &u}
		}}
	return w, nil
}

func isUnspecified(h string) bool {
	ip := net.ParseIP(h)
	return ip != nil && ip.IsUnspecified()
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// serverOnLoopback tells whether the API server of cfg runs on this machine.
func serverOnLoopback(cfg *rest.Config) bool {
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "" { // "127.0.0.1:6443" without a scheme
		host, _, _ = net.SplitHostPort(cfg.Host)
	}
	return isLoopbackHost(host)
}

// Certificates are the certificates the server serves.
func (w *Webhooks) Certificates() *Certificates { return w.certs }

// Server is the admission server (register Go handlers there, or with Register).
func (w *Webhooks) Server() *Server { return w.server }

// Register adds a Go handler and schedules a sync.
func (w *Webhooks) Register(h Handler) error {
	if err := w.server.Register(h); err != nil {
		return err
	}
	w.Resync()
	return nil
}

// Addr is the address the server listens on.
func (w *Webhooks) Addr() net.Addr { return w.ln.Addr() }

// URL is the address the API server is given for path ("" with a Service).
func (w *Webhooks) URL(path string) string {
	if u := w.syncer.ClientConfig(path).URL; u != nil {
		return *u
	}
	return ""
}

// Unreachable is why the API server cannot call the webhooks ("" when it can).
func (w *Webhooks) Unreachable() string { return w.unreachable }

// Ready tells whether the server is serving (readiness: the Service's endpoints
// wait for it).
func (w *Webhooks) Ready() bool { return w.serving.Load() }

// Synced tells whether the configurations were written at least once.
func (w *Webhooks) Synced() bool { return w.synced.Load() }

// Resync schedules a sync of the configurations (after a reload); it does not wait.
func (w *Webhooks) Resync() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// Remove deletes the configurations.
func (w *Webhooks) Remove(ctx context.Context) error { return w.syncer.Remove(ctx) }

// retryEvery is how often a sync that failed or left resources out is tried again.
const retryEvery = 10 * time.Second

// resyncEvery is how often the configurations are compared with the handlers
// anyway: one edited or deleted by someone else is repaired, a rotated CA reaches
// the caBundle; a sync that finds them equal writes nothing.
const resyncEvery = time.Minute

// Start serves until ctx ends, syncing the configurations at start, on Resync,
// when the certificate changes, every resyncEvery and while some are not
// written; with RemoveOnExit it deletes them before returning.
func (w *Webhooks) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("/", w.instrument(w.server))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{GetCertificate: w.certs.GetCertificate, MinVersion: tls.VersionTLS12},
		ErrorLog:  nil}
	errc := make(chan error, 1)
	go func() {
		w.serving.Store(true)
		errc <- srv.ServeTLS(w.ln, "", "")
	}()
	w.log.Info("webhook server listening", "address", w.ln.Addr().String(), "certificate_not_after", w.certs.NotAfter().UTC().Format(time.RFC3339))
	// Renewals and rotations of the certificate while serving (no restart).
	certsDone := make(chan struct{})
	certsCtx, stopCerts := context.WithCancel(ctx)
	go func() { defer close(certsDone); w.certs.Run(certsCtx) }()
	defer func() { stopCerts(); <-certsDone }()
	w.Resync()
	every := w.resyncEvery
	if every <= 0 {
		every = resyncEvery
	}
	periodic := time.NewTicker(every)
	defer periodic.Stop()
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			w.serving.Store(false)
			if w.opts.RemoveOnExit && w.unreachable == "" {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				if err := w.Remove(rctx); err != nil {
					w.log.Error("removing the webhook configurations", "error", err)
				} else {
					w.log.Info("webhook configurations removed")
				}
				cancel()
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = srv.Shutdown(sctx)
			cancel()
			return nil
		case err := <-errc:
			w.serving.Store(false)
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return fmt.Errorf("webhook server: %w", err)
		case <-w.trigger:
		case <-retry:
		case <-periodic.C:
		}
		retry = nil
		if !w.sync(ctx) {
			retry = time.After(retryEvery)
		}
	}
}

// instrument reports every request to the Observer.
func (w *Webhooks) instrument(next http.Handler) http.Handler {
	obs := w.opts.Observer
	if obs == nil {
		return next
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// Series only for the paths of handlers: a stray client must not make
		// unbounded ones.
		label := "unknown"
		if _, path := splitPolicy(r.URL.Path); w.server.serves(path) {
			label = r.URL.Path
		}
		start := time.Now()
		obs.WebhookStarted(label)
		rec := &statusRecorder{ResponseWriter: rw, code: http.StatusOK}
		defer func() { obs.WebhookFinished(label, rec.code, time.Since(start)) }()
		next.ServeHTTP(rec, r)
	})
}

// statusRecorder keeps the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// sync writes the configurations once; false when it should be tried again.
func (w *Webhooks) sync(ctx context.Context) bool {
	handlers := w.server.Handlers()
	if w.unreachable != "" {
		if len(handlers) > 0 {
			w.log.Warn("admission handlers not registered with the API server: " + w.unreachable)
		}
		return true
	}
	bundle := w.certs.CABundle()
	unresolved, err := w.syncer.Sync(ctx, handlers)
	if err != nil {
		w.log.Error("webhook configurations not (fully) written; retrying in "+retryEvery.String(), "error", err)
		return false
	}
	w.certs.Published(bundle)
	w.synced.Store(true)
	if len(unresolved) > 0 {
		w.log.Warn("admission handlers whose resource the cluster does not serve (yet) are left out; retrying in "+retryEvery.String(), "handlers", strings.Join(unresolved, "; "))
		return false
	}
	return true
}
