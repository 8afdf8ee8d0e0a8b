package admission

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
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
	// ClientCA is a PEM file of the CAs that sign the client certificates the API
	// server may present (kopf's WebhookServer cafile; the API server's webhook
	// client credentials, in its AdmissionConfiguration): a certificate they verify
	// reaches the handlers as ctx.sslpeer. Empty: none is asked for.
	ClientCA string
	// EnableHTTP2 lets clients speak HTTP/2 to the webhook server. Off by default, as
	// kubebuilder's scaffold since the 2023 HTTP/2 advisories (rapid reset,
	// CVE-2023-44487 and CVE-2023-39325): the API server calls webhooks over
	// HTTP/1.1 as well, and HTTP/2 only widens what a client can make the server do.
	EnableHTTP2 bool
	// ProbeNamespace is where the reachability probe dry-runs its Lease (probe.go):
	// an existing namespace the operator may create Leases in. Defaults to
	// "default".
	ProbeNamespace string
	// ProbeBudget bounds one probe. Defaults to 6s.
	ProbeBudget time.Duration
	// OnReachability, when set, is called after each probe, from Start's goroutine
	// with no lock held (the dev view, metrics). It must return quickly.
	OnReachability func(Reachability)
	// Inactive starts the Webhooks serving but writing no configuration until
	// SetActive(true): with peering, only the operator that works owns them.
	Inactive bool
	Logger   *slog.Logger
	// CertValidity is how long a generated certificate is valid (default one
	// year); it is renewed, without a restart, when a third of it is left.
	CertValidity time.Duration
	// Observer, when set, is told about every request (controller-runtime's
	// webhook metrics).
	Observer RequestObserver

	// detect replaces the detection of the address (address.go) in tests.
	detect func(context.Context) (Endpoint, bool)
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
	// clientCAs verify the client certificates (Options.ClientCA); nil: none asked.
	clientCAs *x509.CertPool
	syncer    *Syncer
	ln        net.Listener
	log       *slog.Logger
	// unreachable explains why the API server cannot call this operator (a remote
	// cluster and a loopback URL): configurations are then not written.
	unreachable string
	// endpoint is how the registered address was found (detection, address.go);
	// empty with --webhook-url, --webhook-service or an explicit address.
	endpoint Endpoint
	prober   *prober
	// reach is the last probe's outcome; active: this operator owns the
	// configurations (peering); owner: it may have written some (a sync began
	// writing; set before the first write, for a sync cut short may have written
	// some) that are still there, and no peer took them over.
	reach  atomic.Pointer[Reachability]
	active atomic.Bool
	owner  atomic.Bool
	// syncing is closed when the sync under way ends (nil: none; WaitIdle). Set
	// before the sync reads active, so that a SetActive(false) that sync did not
	// see is followed by a WaitIdle that sees the sync.
	syncing atomic.Pointer[chan struct{}]

	trigger chan struct{}
	// lastSyncError is what the last failed sync logged at error level ("" after a
	// success): the same failure again (a refused read, every retryEvery) is said
	// once, then at debug level. Owned by Start's goroutine (sync).
	lastSyncError string
	// probeWarnedOnly tells that the last probe through the Service failed first
	// or right after one succeeded, and was said as a warning: the next is due in retryEvery,
	// and its failure is an error. Owned by Start's goroutine (sync, check).
	probeWarnedOnly bool
	// resyncEvery overrides the package's resyncEvery (tests).
	resyncEvery time.Duration
	serving     atomic.Bool
	synced      atomic.Bool
}

// New listens on opts.Address and prepares the certificates and the syncer;
// nothing is served until Start. rt serves the Lua handlers (nil: Go ones only).
func New(cfg *rest.Config, rt *luabind.Runtime, opts Options) (*Webhooks, error) {
	opts = opts.withDefaults()
	w := &Webhooks{opts: opts, cfg: cfg, log: opts.Logger, trigger: make(chan struct{}, 1)}
	w.active.Store(!opts.Inactive)
	tgt, err := parseTarget(opts)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	listenHost, port, err := net.SplitHostPort(opts.Address)
	if err != nil {
		return nil, fmt.Errorf("--webhook-address=%q: give host:port (\":9443\", \"127.0.0.1:0\"): %w", opts.Address, err)
	}
	registered := ""
	if tgt.byAddress() {
		registered, listenHost = w.registeredHost(cfg, client, listenHost)
	}
	if w.certs, err = w.loadCertificates(client, tgt, tgt.hosts(registered)); err != nil {
		return nil, err
	}
	if w.clientCAs, err = loadClientCAs(opts.ClientCA); err != nil {
		return nil, err
	}
	if err := w.listen(net.JoinHostPort(listenHost, port), &tgt, registered); err != nil {
		return nil, err
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
		ClientConfig: tgt.clientConfig}
	w.prober = &prober{client: client, prefix: opts.Prefix, namespace: opts.ProbeNamespace, budget: opts.ProbeBudget, retryEvery: 250 * time.Millisecond,
		clientConfig: func() admissionregistrationv1.WebhookClientConfig {
			cc := w.syncer.ClientConfig(probePath)
			cc.CABundle = w.certs.CABundle()
			return cc
		}}
	return w, nil
}

// withDefaults fills in the documented defaults.
func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ServicePort == 0 {
		o.ServicePort = 443
	}
	if o.ProbeNamespace == "" {
		o.ProbeNamespace = "default"
	}
	if o.ProbeBudget <= 0 {
		o.ProbeBudget = defaultProbeBudget
	}
	return o
}

// target is how the API server calls the webhooks: through a Service (in-cluster),
// at a base URL given (--webhook-url), or, with neither, at the address this
// operator registers once it listens (listen sets base then).
type target struct {
	svcNS, svcName string
	svcPort        int32
	base           *url.URL
}

// parseTarget reads --webhook-service and --webhook-url.
func parseTarget(opts Options) (target, error) {
	tgt := target{svcPort: opts.ServicePort}
	if opts.Service != "" {
		var ok bool
		tgt.svcNS, tgt.svcName, ok = strings.Cut(opts.Service, "/")
		if !ok || tgt.svcNS == "" || tgt.svcName == "" {
			return tgt, fmt.Errorf("--webhook-service=%q: write it as namespace/name", opts.Service)
		}
	}
	if opts.URL != "" {
		u, err := url.Parse(opts.URL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return tgt, fmt.Errorf("--webhook-url=%q: give an https URL (https://host:port)", opts.URL)
		}
		tgt.base = u
	}
	return tgt, nil
}

// byAddress tells whether neither a Service nor a URL says where the API server
// calls: the operator registers an address of its own.
func (tgt target) byAddress() bool { return tgt.base == nil && tgt.svcName == "" }

// hosts are the names the serving certificate must be valid for: the Service's,
// the URL's host, the registered host.
func (tgt target) hosts(registered string) []string {
	var hosts []string
	if tgt.svcName != "" {
		hosts = append(hosts, tgt.svcName+"."+tgt.svcNS+".svc", tgt.svcName+"."+tgt.svcNS+".svc.cluster.local", tgt.svcName+"."+tgt.svcNS)
	}
	if tgt.base != nil {
		hosts = append(hosts, tgt.base.Hostname())
	}
	if registered != "" {
		hosts = append(hosts, registered)
	}
	return hosts
}

// clientConfig is how a configuration tells the API server to call path.
func (tgt target) clientConfig(path string) admissionregistrationv1.WebhookClientConfig {
	if tgt.svcName != "" {
		port := tgt.svcPort
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
			Namespace: tgt.svcNS, Name: tgt.svcName, Path: &path, Port: &port}}
	}
	u := strings.TrimSuffix(tgt.base.String(), "/") + path
	return admissionregistrationv1.WebhookClientConfig{URL: &u}
}

// registeredHost is the host the API server is given when neither a URL nor a
// Service says: an address the user chose to listen on, else the detected one
// (address.go; it may also tell where to listen), else loopback. It returns the
// host to listen on too.
func (w *Webhooks) registeredHost(cfg *rest.Config, client kubernetes.Interface, listenHost string) (registered, listen string) {
	switch {
	case listenHost != "" && !isUnspecified(listenHost) && !isLoopbackHost(listenHost):
		return listenHost, listenHost // an address the user chose
	case w.opts.DryRun:
		return "127.0.0.1", listenHost
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	detect := w.opts.detect
	if detect == nil {
		detect = newDetector(cfg, client).detect
	}
	ep, ok := detect(ctx)
	if !ok {
		return "127.0.0.1", listenHost
	}
	w.endpoint = ep
	if isLoopbackHost(listenHost) && ep.Listen != "" {
		listenHost = ep.Listen
		if isUnspecified(listenHost) {
			listenHost = ""
		}
	}
	return ep.Host, listenHost
}

// loadCertificates reads the serving certificate from --webhook-cert-dir, or
// generates one: shared by the replicas through a Secret with a Service, kept in
// memory otherwise.
func (w *Webhooks) loadCertificates(client kubernetes.Interface, tgt target, hosts []string) (*Certificates, error) {
	certOpts := CertOptions{Validity: w.opts.CertValidity, Logger: w.opts.Logger}
	switch {
	case w.opts.CertDir != "":
		return LoadCertificates(w.opts.CertDir)
	case tgt.svcName != "" && !w.opts.DryRun:
		// Replicas share one generated CA through a Secret.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return NewSecretCertificates(ctx, client, tgt.svcNS, tgt.svcName+"-tls", hosts, certOpts)
	default:
		certs, err := NewGeneratedCertificates(hosts, certOpts)
		if err != nil {
			return nil, fmt.Errorf("generating the webhook certificate: %w", err)
		}
		return certs, nil
	}
}

// loadClientCAs reads --webhook-client-ca (empty: no client certificate asked).
func loadClientCAs(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--webhook-client-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--webhook-client-ca=%s: no PEM certificate in it", file)
	}
	return pool, nil
}

// listen opens the server's socket; with neither a URL nor a Service, the base URL
// becomes the registered host and the port listened on, and a loopback address a
// remote cluster cannot call makes the webhooks unreachable.
func (w *Webhooks) listen(at string, tgt *target, registered string) error {
	var err error
	if w.ln, err = net.Listen("tcp", at); err != nil {
		return fmt.Errorf("webhook server: cannot listen on %s: %w", at, err)
	}
	if !tgt.byAddress() {
		return nil
	}
	port := w.ln.Addr().(*net.TCPAddr).Port
	tgt.base = &url.URL{Scheme: "https", Host: net.JoinHostPort(registered, strconv.Itoa(port))}
	if isLoopbackHost(registered) && !serverOnThisMachine(w.cfg) {
		w.unreachable = fmt.Sprintf("the cluster at %s is not on this machine and cannot call the webhook at %s, and nothing tells where it could (no node on a network of this machine's, no known local cluster): give --webhook-url (an https address the API server reaches, a tunnel to this port) or --webhook-service (in-cluster); the validate and mutate handlers are not registered with the API server", w.cfg.Host, tgt.base)
	}
	return nil
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

// CertificateNotAfter is when the serving certificate in use expires.
func (w *Webhooks) CertificateNotAfter() time.Time { return w.certs.NotAfter() }

// URL is the address the API server is given for path ("" with a Service).
func (w *Webhooks) URL(path string) string {
	if u := w.syncer.ClientConfig(path).URL; u != nil {
		return *u
	}
	return ""
}

// Unreachable is why the API server cannot call the webhooks ("" when it can).
func (w *Webhooks) Unreachable() string { return w.unreachable }

// Endpoint is how the address given to the API server was found (How is empty
// when --webhook-url, --webhook-service or --webhook-address said).
func (w *Webhooks) Endpoint() Endpoint { return w.endpoint }

// Reachability is the outcome of the last reachability probe.
func (w *Webhooks) Reachability() Reachability {
	if r := w.reach.Load(); r != nil {
		return *r
	}
	return Reachability{}
}

// ByServiceName is --webhook-service ("namespace/name"), "" without.
func (w *Webhooks) ByServiceName() string { return w.opts.Service }

// ByService tells whether the API server calls the webhooks through a Service
// (replicas behind it answer) rather than a URL naming this process.
func (w *Webhooks) ByService() bool { return w.opts.Service != "" }

// SetActive makes this operator own the configurations (true: it writes them,
// now) or leave them to a peer (false: it keeps serving what is sent to it, but
// writes nothing, and does not remove them at exit). Peering calls it.
func (w *Webhooks) SetActive(active bool) {
	if w.active.Swap(active) == active {
		return
	}
	if active {
		w.Resync()
		return
	}
	w.owner.Store(false)
}

// WaitIdle returns once no sync is under way (or with ctx's error): after
// SetActive(false), a sync that began while this operator still owned the
// configurations may yet write (or, its probe failing, withdraw) them; once
// WaitIdle returned, a peer can write its own without this operator's overwriting
// them. Peering's pause waits for it.
func (w *Webhooks) WaitIdle(ctx context.Context) error {
	done := w.syncing.Load()
	if done == nil {
		return nil
	}
	select {
	case <-*done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

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

// Remove deletes the configurations, the probe's included.
func (w *Webhooks) Remove(ctx context.Context) error {
	return errors.Join(w.syncer.Remove(ctx), w.prober.remove(ctx))
}

// retryEvery is how often a sync that failed or left resources out is tried again.
const retryEvery = 10 * time.Second

// resyncEvery is how often the configurations are compared with the handlers
// anyway: one edited or deleted by someone else is repaired, a rotated CA reaches
// the caBundle; a sync that finds them equal writes nothing.
const resyncEvery = time.Minute

// tlsConfig is the server's TLS: its certificate, and with Options.ClientCA the
// client certificates it verifies when given (ctx.sslpeer); a client without one
// is served all the same (the API server's default).
func (w *Webhooks) tlsConfig() *tls.Config {
	cfg := &tls.Config{GetCertificate: w.certs.GetCertificate, MinVersion: tls.VersionTLS12}
	if w.clientCAs != nil {
		cfg.ClientAuth, cfg.ClientCAs = tls.VerifyClientCertIfGiven, w.clientCAs
	}
	return cfg
}

// Start serves until ctx ends, syncing the configurations at start, on Resync,
// when the certificate changes, every resyncEvery and while some are not
// written; with RemoveOnExit it deletes them before returning.
func (w *Webhooks) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("/", w.instrument(w.server))
	mux.HandleFunc(probePath, answerProbe)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: w.tlsConfig(), ErrorLog: nil, Protocols: Protocols(w.opts.EnableHTTP2)}
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
			// Only what this operator wrote, and still owns: a peer working now
			// (peering) keeps its own.
			if w.opts.RemoveOnExit && w.unreachable == "" && w.owner.Load() && w.active.Load() {
				w.removeOnExit(ctx)
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
		done := make(chan struct{})
		w.syncing.Store(&done)
		ok := w.sync(ctx)
		w.syncing.Store(nil)
		close(done)
		if !ok {
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
//
// When the configurations give the API server a URL (this process), the handlers'
// webhooks are written only once a probe proved that the API server reaches it,
// and removed when a later probe fails: a webhook nobody answers would reject
// (failure policy Fail) or silently skip (Ignore) every request it covers. Through
// a Service (replicas behind it) they are written anyway and the probe only
// reports: a pod becomes an endpoint of the Service once ready, which must not wait
// for a probe that needs a ready endpoint.
func (w *Webhooks) sync(ctx context.Context) bool {
	handlers := w.server.Handlers()
	if w.unreachable != "" {
		if len(handlers) > 0 {
			w.log.Warn("admission handlers not registered with the API server: " + w.unreachable)
		}
		return true
	}
	if !w.active.Load() {
		return true // a peer works and owns the configurations
	}
	if len(handlers) == 0 && !w.owner.Load() {
		// No admission handler, and nothing this operator wrote to remove: the
		// configurations are neither read nor written. An operator without
		// admission handlers needs no right on them (luaop rbac grants none), and
		// one that has none must not be refused a read every retryEvery.
		w.synced.Store(true)
		return true
	}
	// From here on this sync writes (the probe's configuration, the handlers'):
	// what it wrote is this operator's to remove at exit even when it ends halfway
	// (the stop cutting a request short, a write refused). Set after the sync
	// succeeded, the flag missed those, and RemoveOnExit left them behind.
	w.owner.Store(true)
	if len(handlers) > 0 && !w.ByService() && w.probeDue() {
		if r := w.check(ctx); !r.Reachable {
			w.withdraw(ctx)
			return true // tried again on the next Resync (a reload) or resyncEvery
		}
	}
	bundle := w.certs.CABundle()
	unresolved, err := w.syncer.Sync(ctx, handlers)
	if err != nil {
		w.syncFailed(err)
		return false
	}
	if w.lastSyncError != "" {
		w.lastSyncError = ""
		w.log.Info("webhook configurations written")
	}
	if r := w.reach.Load(); len(handlers) > 0 && r != nil && r.Checked {
		// The probe's configuration carries the caBundle too: it is published with
		// the handlers' (a new CA signs only once both hold it), or the next probe
		// would find the API server distrusting the renewed certificate and, called
		// at a URL, withdraw the handlers' webhooks.
		if err := w.prober.ensure(ctx); err != nil {
			w.syncFailed(fmt.Errorf("the probe's webhook configuration: %w", err))
			return false
		}
	}
	w.certs.Published(bundle)
	w.synced.Store(true)
	if len(handlers) == 0 {
		// Nothing to call: the probe's configuration goes with the handlers'.
		if r := w.reach.Load(); r != nil && r.Checked {
			if err := w.prober.remove(ctx); err != nil {
				w.syncFailed(fmt.Errorf("the probe's webhook configuration: %w", err))
				return false
			}
			w.reach.Store(&Reachability{})
		}
		w.owner.Store(false) // nothing of this operator's is left to remove
	} else if w.ByService() && w.probeDue() {
		w.check(ctx)
	}
	if len(unresolved) > 0 {
		w.log.Warn("admission handlers whose resource the cluster does not serve (yet) are left out; retrying in "+retryEvery.String(), "handlers", strings.Join(unresolved, "; "))
		return false
	}
	return !w.probeWarnedOnly // a probe said as a warning is checked again in retryEvery
}

// syncFailed logs a failed sync: at error level once, and the same failure again
// (retried every retryEvery: a right not granted stays refused) at debug level.
func (w *Webhooks) syncFailed(err error) {
	msg := err.Error()
	if msg == w.lastSyncError {
		w.log.Debug("webhook configurations still not (fully) written; retrying in "+retryEvery.String(), "error", err)
		return
	}
	w.lastSyncError = msg
	w.log.Error("webhook configurations not (fully) written; retrying every "+retryEvery.String()+" (said again only if the error changes)", "error", err)
}

// probeDue tells whether the reachability is to be checked (again): never checked,
// failed, or checked more than resyncEvery ago.
func (w *Webhooks) probeDue() bool {
	r := w.reach.Load()
	return r == nil || !r.Checked || !r.Reachable || time.Since(r.At) >= w.every()
}

func (w *Webhooks) every() time.Duration {
	if w.resyncEvery > 0 {
		return w.resyncEvery
	}
	return resyncEvery
}

// check runs the probe, records and logs its outcome (a change of it, or every
// failure at error level with what to do), and tells OnReachability.
func (w *Webhooks) check(ctx context.Context) Reachability {
	start := time.Now()
	err := w.prober.run(ctx)
	r := Reachability{Checked: true, Reachable: err == nil, At: time.Now(), Took: time.Since(start), Service: w.opts.Service}
	if !w.ByService() {
		r.URL = strings.TrimSuffix(w.URL("/"), "/")
	}
	prev := w.reach.Swap(&r)
	where := r.URL
	if r.Service != "" {
		where = "Service " + r.Service
	}
	warnedOnly := w.probeWarnedOnly
	w.probeWarnedOnly = false
	if err != nil {
		r.Error = w.whatToDo(err)
		w.reach.Store(&r)
		switch {
		case w.ByService() && !warnedOnly && (prev == nil || !prev.Checked || prev.Reachable):
			// Through a Service, a first probe failing (this replica just took the
			// webhooks over) or one right after a success is most often a replica
			// replaced: for a moment the API server still calls the address of a pod
			// that is gone. Said as a warning and checked again soon; failing
			// again, it is an error.
			w.probeWarnedOnly = true
			w.log.Warn(r.Error, "checked_again_in", retryEvery.String())
		case prev == nil || prev.Error != r.Error || warnedOnly:
			w.log.Error(r.Error)
		}
	} else if prev == nil || !prev.Reachable {
		w.log.Info("webhook server reachable: the API server called it", "at", where, "probe_ms", float64(r.Took.Microseconds())/1000)
	}
	if w.opts.OnReachability != nil {
		w.opts.OnReachability(r)
	}
	return r
}

// whatToDo explains a failed probe and what to do about it.
func (w *Webhooks) whatToDo(err error) string {
	if !errors.Is(err, errNotReached) {
		return fmt.Sprintf("the reachability of the webhook server could not be checked: %v", err)
	}
	if w.ByService() {
		return fmt.Sprintf("the API server cannot call the webhooks through Service %s: %s; check that the Service selects the operator's pods, that they are ready, and that its port reaches --webhook-address", w.opts.Service, strings.TrimPrefix(err.Error(), errNotReached.Error()+": "))
	}
	how := ""
	if w.endpoint.How != "" {
		how = " (found as " + w.endpoint.How + ")"
	}
	reason := strings.TrimPrefix(err.Error(), errNotReached.Error()+": ")
	return fmt.Sprintf("the API server cannot call the webhook server at %s%s: %v. The validate and mutate handlers are not registered, so that no webhook rejects requests nobody answers. "+
		"Give --webhook-url https://HOST:PORT with an address the API server reaches (this machine's address on the cluster's network, or a tunnel to port %d of this machine), "+
		"or run the operator in the cluster (--webhook-service)", strings.TrimSuffix(w.URL("/"), "/"), how, reason, w.ln.Addr().(*net.TCPAddr).Port)
}

// withdraw removes the configurations this operator wrote (a failed probe); those
// it could not remove stay its own (removed at exit, or by the next withdraw).
func (w *Webhooks) withdraw(ctx context.Context) {
	if err := w.Remove(ctx); err != nil {
		w.log.Error("removing the webhook configurations after a failed probe", "error", err)
		return
	}
	w.owner.Store(false)
}

// removeOnExit deletes the configurations this operator wrote (RemoveOnExit), on
// a context of its own: the stop ended Start's. One it could not delete is named
// with what to do, for a webhook nobody answers rejects what it covers.
func (w *Webhooks) removeOnExit(stopped context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(stopped), 10*time.Second)
	defer cancel()
	if err := w.Remove(ctx); err != nil {
		vname, mname := ConfigurationNames(w.opts.Prefix)
		w.log.Error("the webhook configurations were not removed at exit: the API server keeps calling webhooks nobody answers, "+
			"rejecting what their Fail handlers cover; remove them with: luaop webhooks remove --prefix "+w.opts.Prefix,
			"configurations", strings.Join([]string{vname, mname, ProbeConfigurationName(w.opts.Prefix)}, ", "), "error", err)
		return
	}
	w.log.Info("webhook configurations removed")
}

// Protocols are the HTTP versions luaop's TLS servers (webhooks, secure metrics)
// speak: HTTP/1.1, and HTTP/2 only when enabled (see Options.EnableHTTP2).
func Protocols(enableHTTP2 bool) *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetHTTP2(enableHTTP2)
	return p
}
