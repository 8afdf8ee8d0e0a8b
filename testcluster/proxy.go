package testcluster

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Proxy is a reverse proxy in front of a test cluster's kube-apiserver, for faults
// between a client and the server: latency on every request, and watches that end
// with 410 Gone (an expired resourceVersion) on command. Its Env connects through
// it (TLS to the proxy, which forwards with the cluster's own credentials).
type Proxy struct {
	// Env connects through the proxy: give it to the operator under test.
	Env *Env

	upstream  *url.URL
	transport http.RoundTripper
	rp        *httputil.ReverseProxy
	server    *httptest.Server

	mu         sync.Mutex
	latency    func(*http.Request) time.Duration
	eventDelay func(*http.Request) time.Duration
	seen       []Request
	active     map[*activeWatch]struct{}
	hold       func(*http.Request) bool // set while watches are held (ExpireWatches)
	held       map[*activeWatch]struct{}
	release    chan struct{} // closed by AnswerGone
	answered   int

	intercept Interceptor // SetInterceptor
	cut       int         // requests an interceptor cut
	// streams are the watch streams running now (eventStream), for
	// CoalesceWatchEvents; coalesce is the hold in force (nil: none).
	streams  map[*eventStream]struct{}
	coalesce *coalescing
	stale    *staleList // ServeStaleList, until it served one
}

// Request is one request the proxy received.
type Request struct {
	Method string
	URL    *url.URL
	// At is when the proxy received it, before its latency.
	At time.Time
	// Delay is the latency injected before it was forwarded.
	Delay time.Duration
	// Gone is set when the proxy answered it with 410 Gone instead of forwarding it.
	Gone bool
	// Cut is set when an interceptor cut it before it was forwarded (a cut after
	// the upstream answered is not recorded here: the request did reach it).
	Cut bool
	// Stale is set when the proxy answered it from a saved list (ServeStaleList).
	Stale bool
}

type activeWatch struct {
	req    *http.Request
	cancel context.CancelFunc
}

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	// Latency, when set, gives each request the time the proxy waits before
	// forwarding it (a watch's wait is before its stream starts).
	Latency func(*http.Request) time.Duration
	// WatchEventDelay, when set, holds back what each watch's stream carries:
	// every chunk the upstream sends (kube-apiserver flushes one per event) reaches
	// the client that long after the proxy read it, in order, so the client sees
	// every change, its own writes included, late. It is called once per chunk.
	WatchEventDelay func(*http.Request) time.Duration
}

// NewProxy starts a proxy in front of e's kube-apiserver until the test ends.
func (e *Env) NewProxy(t testing.TB, opts ProxyOptions) *Proxy {
	t.Helper()
	e.Require(t)
	p, err := StartProxy(e.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// StartProxy starts a proxy in front of the kube-apiserver cfg connects to, for
// programs that are not tests (bench/soak's chaos run); Close stops it.
func StartProxy(cfg *rest.Config, opts ProxyOptions) (*Proxy, error) {
	upstream, err := url.Parse(cfg.Host)
	if err != nil || upstream.Host == "" {
		return nil, fmt.Errorf("the cluster's address %q: %v", cfg.Host, err)
	}
	if upstream.Scheme == "" {
		upstream.Scheme = "https"
	}
	transport, err := rest.TransportFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the cluster's transport: %w", err)
	}
	p := &Proxy{upstream: upstream, transport: transport, latency: opts.Latency, eventDelay: opts.WatchEventDelay,
		active: map[*activeWatch]struct{}{}, held: map[*activeWatch]struct{}{}, streams: map[*eventStream]struct{}{}}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.Host = upstream.Host
			if IsWatch(r.In) {
				// A watch's events are read here (eventStream): the proxy's transport
				// asks for a compressed stream itself and inflates it, which it does
				// not when the client asked (client-go does).
				r.Out.Header.Del("Accept-Encoding")
			}
		},
		Transport:     transport,
		FlushInterval: -1, // watch events go through at once
		ErrorLog:      log.New(io.Discard, "", 0),
		ModifyResponse: func(resp *http.Response) error {
			if resp.Request == nil {
				return nil
			}
			if !IsWatch(resp.Request) {
				return p.interceptAnswer(resp)
			}
			if resp.Request.Context().Err() != nil {
				// Cut before the upstream answered: its answer (an empty 200 once it
				// saw the proxy go away) must not reach the client, which would take
				// it for a watch that ended normally. ErrorHandler aborts instead.
				return resp.Request.Context().Err()
			}
			if resp.StatusCode == http.StatusOK && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
				resp.Body = p.newEventStream(resp.Request, resp.Body)
			}
			p.mu.Lock()
			delay := p.eventDelay
			p.mu.Unlock()
			if delay != nil {
				resp.Body = newDelayedBody(resp.Body, func() time.Duration { return delay(resp.Request) })
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil && !errors.Is(err, errCut) {
				http.Error(w, "proxy: "+err.Error(), http.StatusBadGateway)
				return
			}
			// The client's request was cut (ExpireWatches, an interceptor, or the
			// client went away) before its answer was relayed: abort the response,
			// so that the client sees its connection end rather than an empty 200.
			panic(http.ErrAbortHandler)
		},
	}
	p.server = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.server.Config.ErrorLog = log.New(io.Discard, "", 0)
	p.server.StartTLS()

	proxied := rest.AnonymousClientConfig(cfg) // the proxy adds the credentials
	proxied.Host = p.server.URL
	proxied.TLSClientConfig = rest.TLSClientConfig{
		CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.server.Certificate().Raw}),
	}
	p.Env = &Env{Config: proxied}
	if p.Env.Dynamic, err = dynamic.NewForConfig(proxied); err != nil {
		p.Close()
		return nil, err
	}
	if p.Env.Kube, err = kubernetes.NewForConfig(proxied); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close stops the proxy: its watches end, its connections are cut.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.release != nil {
		close(p.release)
		p.release, p.hold = nil, nil
	}
	for w := range p.active {
		w.cancel()
	}
	p.mu.Unlock()
	p.server.CloseClientConnections()
	p.server.Close()
}

// IsWatch tells whether r is a watch request.
func IsWatch(r *http.Request) bool {
	v := r.URL.Query().Get("watch")
	return v == "true" || v == "1"
}

// IsList tells whether r reads a whole collection from scratch: a list (GET of a
// collection, without watch), or a watch that starts with the collection's current
// objects (sendInitialEvents=true, what client-go's informers use to list). A
// collection's path ends with its resource's plural name, given as resource
// ("widgets"); a GET of one object (…/widgets/w0) is no list.
func IsList(r *http.Request, resource string) bool {
	if r.Method != http.MethodGet || !strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/"+resource) {
		return false
	}
	if !IsWatch(r) {
		return true
	}
	return r.URL.Query().Get("sendInitialEvents") == "true"
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	rec := Request{Method: r.Method, URL: r.URL, At: time.Now()}
	p.mu.Lock()
	latency := p.latency
	p.mu.Unlock()
	if latency != nil {
		rec.Delay = latency(r)
	}
	if rec.Delay > 0 {
		select {
		case <-time.After(rec.Delay):
		case <-r.Context().Done():
			return
		}
	}
	if stale := p.takeStale(r); stale != nil {
		rec.Stale = true
		p.record(rec)
		p.serveStale(w, r, stale)
		return
	}
	if !IsWatch(r) {
		r, cut := p.interceptRequest(r)
		rec.Cut = cut
		p.record(rec)
		if cut {
			panic(http.ErrAbortHandler) // the client sees its connection end
		}
		p.rp.ServeHTTP(w, r)
		return
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	aw := &activeWatch{req: r, cancel: cancel}
	p.mu.Lock()
	// A watch that resumes from a resourceVersion (not one that lists) is held
	// while ExpireWatches is in force, and answered with 410 by AnswerGone.
	if p.hold != nil && p.hold(r) && r.URL.Query().Get("sendInitialEvents") != "true" {
		release := p.release
		p.held[aw] = struct{}{}
		p.mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
		p.mu.Lock()
		delete(p.held, aw)
		p.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		rec.Gone = true
		p.record(rec)
		p.mu.Lock()
		p.answered++
		p.mu.Unlock()
		writeGone(w)
		return
	}
	p.active[aw] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.active, aw)
		p.mu.Unlock()
	}()
	p.record(rec)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// goneEvent is what kube-apiserver sends on a watch from a resourceVersion that is
// no longer in its history (compacted).
const goneEvent = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",` +
	`"message":"too old resource version","reason":"Expired","code":410}}` + "\n"

func writeGone(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache, private")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, goneEvent)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
}

func (p *Proxy) record(r Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = append(p.seen, r)
}

// Requests returns the requests forwarded or answered so far, in the order they
// were (after their latency; Request.At is when each arrived, before it), those
// answered with 410 Gone included.
func (p *Proxy) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.seen...)
}

// SetLatency replaces the latency function (nil: none).
func (p *Proxy) SetLatency(latency func(*http.Request) time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = latency
}

// ExpireWatches cuts the running watches that match (the client sees its stream
// end, as when a connection or the server goes away) and holds the matching watches
// that come next, which resume from the resourceVersion the client last saw, until
// AnswerGone. Meanwhile the client's view falls behind the server's: what changes is
// what a compacted history would no longer give. It returns how many watches it cut.
func (p *Proxy) ExpireWatches(match func(*http.Request) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == nil {
		p.release = make(chan struct{})
	}
	p.hold = match
	cut := 0
	for w := range p.active {
		if match(w.req) {
			w.cancel()
			delete(p.active, w)
			cut++
		}
	}
	return cut
}

// HeldWatches is how many watches ExpireWatches holds now.
func (p *Proxy) HeldWatches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// AnswerGone answers the held watches with a watch ERROR event carrying a Status
// with code 410 and reason Expired, as kube-apiserver does for a resourceVersion
// that was compacted, and stops holding watches: the client must list again.
func (p *Proxy) AnswerGone() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.release != nil {
		close(p.release)
	}
	p.release, p.hold = nil, nil
}

// GoneAnswered is how many watches were answered with 410 Gone so far.
func (p *Proxy) GoneAnswered() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.answered
}

// String names the proxy and its upstream, for logs.
func (p *Proxy) String() string {
	return fmt.Sprintf("proxy %s -> %s", p.server.URL, strings.TrimSuffix(p.upstream.String(), "/"))
}

// delayedBody hands on what body carries, each chunk delay() after it was read
// from body, in order (a chunk is never handed on before the one before it).
type delayedBody struct {
	body   io.ReadCloser
	chunks chan delayedChunk
	done   chan struct{}
	once   sync.Once
	rest   []byte
	err    error
}

type delayedChunk struct {
	data []byte
	due  time.Time
	err  error
}

func newDelayedBody(body io.ReadCloser, delay func() time.Duration) *delayedBody {
	d := &delayedBody{body: body, chunks: make(chan delayedChunk, 1024), done: make(chan struct{})}
	go func() {
		var last time.Time
		for {
			buf := make([]byte, 32*1024)
			n, err := body.Read(buf)
			due := time.Now().Add(delay())
			if due.Before(last) {
				due = last
			}
			last = due
			select {
			case d.chunks <- delayedChunk{data: buf[:n], due: due, err: err}:
			case <-d.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return d
}

func (d *delayedBody) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		var c delayedChunk
		select {
		case c = <-d.chunks:
		case <-d.done:
			return 0, io.ErrClosedPipe
		}
		if wait := time.Until(c.due); wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-d.done:
				timer.Stop()
				return 0, io.ErrClosedPipe
			}
		}
		d.rest, d.err = c.data, c.err
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

func (d *delayedBody) Close() error {
	d.once.Do(func() { close(d.done) })
	return d.body.Close()
}
