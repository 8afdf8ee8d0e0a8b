package testcluster

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// fakeUpstream stands for kube-apiserver: a watch of widgets sends one event per
// value written to events (each flushed at once) until the client goes away; a watch
// with resourceVersion=slow sends no headers until the client goes away; any other
// request gets a small JSON object.
type fakeUpstream struct {
	server *httptest.Server
	events chan string

	mu   sync.Mutex
	sent map[string]time.Time // event -> when it was flushed
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	u := &fakeUpstream{events: make(chan string, 16), sent: map[string]time.Time{}}
	u.server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !IsWatch(r) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"kind":"Widget"}`)
			return
		}
		if r.URL.Query().Get("resourceVersion") == "slow" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case e := <-u.events:
				_, _ = io.WriteString(w, e+"\n")
				w.(http.Flusher).Flush()
				u.mu.Lock()
				u.sent[e] = time.Now()
				u.mu.Unlock()
			}
		}
	}))
	t.Cleanup(u.server.Close)
	return u
}

func (u *fakeUpstream) sentAt(e string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sent[e]
}

// newTestProxy starts a Proxy in front of a fake upstream, and an HTTP client that
// goes through it.
func newTestProxy(t *testing.T, opts ProxyOptions) (*Proxy, *fakeUpstream, *http.Client) {
	t.Helper()
	u := newFakeUpstream(t)
	env := &Env{Config: &rest.Config{Host: u.server.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}}
	p := env.NewProxy(t, opts)
	transport, err := rest.TransportFor(p.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return p, u, &http.Client{Transport: transport}
}

const widgetsPath = "/apis/examples.luaop.dev/v1/namespaces/ns/widgets"

// watchAnswer is how a watch opened by watchInBackground ended.
type watchAnswer struct {
	status int
	body   string
	err    error
}

// watchInBackground opens a watch through p and reads it to its end in a goroutine.
func watchInBackground(t *testing.T, p *Proxy, c *http.Client, query string) <-chan watchAnswer {
	answers := make(chan watchAnswer, 1)
	go func() {
		resp, cancel, err := openWatch(t, p, c, query)
		defer cancel()
		if err != nil {
			answers <- watchAnswer{err: err}
			return
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		answers <- watchAnswer{resp.StatusCode, string(body), err}
	}()
	return answers
}

// openWatch starts a watch of widgets through the proxy; cancel ends it. It reports
// errors instead of failing the test: watchInBackground calls it off the test's
// goroutine.
func openWatch(t *testing.T, p *Proxy, c *http.Client, query string) (*http.Response, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Env.Config.Host+widgetsPath+"?watch=true&"+query, nil)
	if err != nil {
		return nil, cancel, err
	}
	resp, err := c.Do(req)
	return resp, cancel, err
}

func TestIsList(t *testing.T) {
	for _, tc := range []struct {
		method, url string
		want        bool
	}{
		{http.MethodGet, widgetsPath, true},
		{http.MethodGet, widgetsPath + "/", true},
		{http.MethodGet, widgetsPath + "?limit=500", true},
		{http.MethodGet, widgetsPath + "/w0", false},
		{http.MethodGet, widgetsPath + "?watch=true&resourceVersion=5", false},
		{http.MethodGet, widgetsPath + "?watch=true&sendInitialEvents=true", true},
		{http.MethodPost, widgetsPath, false},
		{http.MethodGet, "/apis/examples.luaop.dev/v1/namespaces/ns/gadgets", false},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := IsList(&http.Request{Method: tc.method, URL: u}, "widgets"); got != tc.want {
			t.Errorf("IsList(%s %s) = %v, want %v", tc.method, tc.url, got, tc.want)
		}
	}
}

func TestProxyLatencyIsRecorded(t *testing.T) {
	p, _, c := newTestProxy(t, ProxyOptions{Latency: func(*http.Request) time.Duration { return 20 * time.Millisecond }})
	resp, err := c.Get(p.Env.Config.Host + widgetsPath + "/w0")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "Widget") {
		t.Fatalf("through the proxy: %s %q", resp.Status, body)
	}
	reqs := p.Requests()
	if len(reqs) != 1 || reqs[0].Delay != 20*time.Millisecond || reqs[0].Method != http.MethodGet || reqs[0].Gone {
		t.Fatalf("recorded %+v, want one GET delayed 20ms", reqs)
	}
}

func TestProxyCutHoldAndGone(t *testing.T) {
	p, u, c := newTestProxy(t, ProxyOptions{})
	resp, cancel, err := openWatch(t, p, c, "resourceVersion=1")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	u.events <- `{"type":"ADDED"}`
	lines := bufio.NewReader(resp.Body)
	if line, err := lines.ReadString('\n'); err != nil || !strings.Contains(line, "ADDED") {
		t.Fatalf("first event through the proxy: %q, %v", line, err)
	}

	ofWidgets := func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/widgets") }
	if cut := p.ExpireWatches(ofWidgets); cut != 1 {
		t.Fatalf("ExpireWatches cut %d watches, want 1", cut)
	}
	if rest, err := io.ReadAll(lines); err == nil && len(rest) > 0 {
		t.Fatalf("the cut watch went on: %q", rest)
	}
	_ = resp.Body.Close()

	// The next watch, from a resourceVersion, is held until AnswerGone.
	answers := watchInBackground(t, p, c, "resourceVersion=2")
	Eventually(t, 10*time.Second, func() (bool, string) {
		return p.HeldWatches() == 1, "waiting for the proxy to hold the next watch"
	})
	p.AnswerGone()
	a := <-answers
	if a.err != nil || !strings.Contains(a.body, `"code":410`) || !strings.Contains(a.body, `"reason":"Expired"`) {
		t.Fatalf("the held watch was answered %q (%v), want a 410 Expired ERROR event", a.body, a.err)
	}
	if p.GoneAnswered() != 1 {
		t.Fatalf("GoneAnswered = %d, want 1", p.GoneAnswered())
	}
	reqs := p.Requests()
	if len(reqs) != 2 || reqs[0].Gone || !reqs[1].Gone {
		t.Fatalf("recorded %+v, want the first watch forwarded and the second answered Gone", reqs)
	}
}

// A watch cut before the upstream sent its headers ends with a broken response,
// not an empty 200 the client would take for a watch that ended normally.
func TestProxyCutBeforeHeadersAborts(t *testing.T) {
	p, _, c := newTestProxy(t, ProxyOptions{})
	answers := watchInBackground(t, p, c, "resourceVersion=slow")
	Eventually(t, 10*time.Second, func() (bool, string) {
		return len(p.Requests()) == 1, "waiting for the watch to reach the proxy"
	})
	// The request is recorded just before it is forwarded: cut until it is cut.
	Eventually(t, 10*time.Second, func() (bool, string) {
		return p.ExpireWatches(func(*http.Request) bool { return true }) == 1, "waiting for the watch to be cut"
	})
	p.AnswerGone() // stop holding
	if a := <-answers; a.err == nil {
		t.Fatalf("the watch cut before its headers was answered %d without error, want a broken response", a.status)
	}
}

func TestProxyWatchEventDelay(t *testing.T) {
	const delay = 200 * time.Millisecond
	p, u, c := newTestProxy(t, ProxyOptions{WatchEventDelay: func(*http.Request) time.Duration { return delay }})
	resp, cancel, err := openWatch(t, p, c, "resourceVersion=1")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	defer func() { _ = resp.Body.Close() }()
	lines := bufio.NewReader(resp.Body)
	for _, e := range []string{`{"n":1}`, `{"n":2}`, `{"n":3}`} {
		u.events <- e
		line, err := lines.ReadString('\n')
		got := time.Now()
		if err != nil || strings.TrimSpace(line) != e {
			t.Fatalf("event through the proxy: %q, %v; want %s", line, err, e)
		}
		// A lower bound only: the proxy cannot hand an event on before its delay.
		if sent := u.sentAt(e); got.Sub(sent) < delay {
			t.Errorf("event %s came through %s after the upstream sent it, want at least %s", e, got.Sub(sent), delay)
		}
	}
}
