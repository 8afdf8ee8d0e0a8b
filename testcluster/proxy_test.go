package testcluster

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
)

// fakeUpstream stands for kube-apiserver: a watch of widgets sends one event per
// value written to events (each flushed at once) until the client goes away; a watch
// with resourceVersion=slow sends no headers until the client goes away; any other
// request gets a small JSON object.
type fakeUpstream struct {
	server *httptest.Server
	events chan string

	mu      sync.Mutex
	sent    map[string]time.Time // event -> when it was flushed
	writing map[string]time.Time // event -> when its write began (the proxy may read it from then on)
	served  int                  // requests that are not watches
	watches []url.Values         // the queries of the watches, in order
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	u := &fakeUpstream{events: make(chan string, 16), sent: map[string]time.Time{}, writing: map[string]time.Time{}}
	u.server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		if IsWatch(r) {
			u.watches = append(u.watches, r.URL.Query())
		} else {
			u.served++
		}
		u.mu.Unlock()
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
		var out io.Writer = w
		flush := func() { w.(http.Flusher).Flush() }
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			// As kube-apiserver does for a client that accepts it.
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			defer gz.Close()
			out = gz
			flush = func() { _ = gz.Flush(); w.(http.Flusher).Flush() }
		}
		w.WriteHeader(http.StatusOK)
		flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case e := <-u.events:
				u.mu.Lock()
				u.writing[e] = time.Now()
				u.mu.Unlock()
				_, _ = io.WriteString(out, e+"\n")
				flush()
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

// writtenFrom is when the upstream began writing the event: the earliest the
// proxy can have read it (sentAt, taken after the flush, may come later than the
// proxy's read on a loaded machine).
func (u *fakeUpstream) writtenFrom(e string) time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.writing[e]
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
		if sent := u.writtenFrom(e); got.Sub(sent) < delay {
			t.Errorf("event %s came through %s after the upstream sent it, want at least %s", e, got.Sub(sent), delay)
		}
	}
}

func (u *fakeUpstream) servedCount() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.served
}

// An interceptor sees each request before it is forwarded and its answer before it
// is relayed; cutting before keeps it from the upstream, cutting after lets the
// upstream apply it and keeps the answer from the client.
func TestProxyInterceptorCutsBeforeAndAfter(t *testing.T) {
	p, u, c := newTestProxy(t, ProxyOptions{})
	var mu sync.Mutex
	var seen []string
	cutAt := BeforeUpstream
	p.SetInterceptor(func(x *Exchange) Verdict {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, fmt.Sprintf("%s %s %s %d %s", x.Stage, x.Request.Method, x.Body, x.Status, x.Answer))
		if x.Request.URL.Query().Get("cut") == "yes" && x.Stage == cutAt {
			return Cut
		}
		return Forward
	})
	patch := func(query string) (string, error) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPatch, p.Env.Config.Host+widgetsPath+"/w0?"+query, strings.NewReader(`{"spec":1}`))
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		return string(body), err
	}
	if body, err := patch("cut=no"); err != nil || body != `{"kind":"Widget"}` {
		t.Fatalf("a request the interceptor forwards: %q, %v", body, err)
	}
	if u.servedCount() != 1 {
		t.Fatalf("the upstream served %d requests, want 1", u.servedCount())
	}
	if _, err := patch("cut=yes"); err == nil {
		t.Fatalf("a request cut before the upstream was answered")
	}
	if u.servedCount() != 1 {
		t.Fatalf("a request cut before the upstream reached it (served %d)", u.servedCount())
	}
	cutAt = AfterUpstream
	if _, err := patch("cut=yes"); err == nil {
		t.Fatalf("an answer cut after the upstream reached the client")
	}
	if u.servedCount() != 2 {
		t.Fatalf("a request cut after the upstream did not reach it (served %d, want 2)", u.servedCount())
	}
	if p.CutRequests() != 2 {
		t.Fatalf("CutRequests = %d, want 2", p.CutRequests())
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{
		`before PATCH {"spec":1} 0 `, `after PATCH {"spec":1} 200 {"kind":"Widget"}`,
		`before PATCH {"spec":1} 0 `,
		`before PATCH {"spec":1} 0 `, `after PATCH {"spec":1} 200 {"kind":"Widget"}`,
	}
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Fatalf("the interceptor saw\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	reqs := p.Requests()
	if len(reqs) != 3 || reqs[0].Cut || !reqs[1].Cut || reqs[2].Cut {
		t.Fatalf("recorded %+v, want the second request cut (before), the others forwarded", reqs)
	}
}

func watchEvent(typ, name, uid string, n int) string {
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"Widget","metadata":{"namespace":"ns","name":%q,"uid":%q,"resourceVersion":"%d"}}}`, typ, name, uid, n)
}

// While a hold is in force, a watch delivers nothing; at its end, the last event of
// each object, in the order of their last changes: a delete and re-create is the new
// object's event alone.
func TestProxyCoalescesWatchEvents(t *testing.T) {
	p, u, c := newTestProxy(t, ProxyOptions{})
	resp, cancel, err := openWatch(t, p, c, "resourceVersion=1")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	defer func() { _ = resp.Body.Close() }()
	lines := bufio.NewReader(resp.Body)
	u.events <- watchEvent("ADDED", "w0", "u0", 2)
	if line, err := lines.ReadString('\n'); err != nil || strings.TrimSpace(line) != watchEvent("ADDED", "w0", "u0", 2) {
		t.Fatalf("before the hold: %q, %v", line, err)
	}

	release := p.CoalesceWatchEvents(func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/widgets") })
	burst := []string{
		watchEvent("MODIFIED", "w0", "u0", 3),
		watchEvent("ADDED", "w1", "u1", 4),
		watchEvent("MODIFIED", "w0", "u0", 5),
		watchEvent("DELETED", "w0", "u0", 6),
		watchEvent("MODIFIED", "w1", "u1", 7),
		watchEvent("ADDED", "w0", "u2", 8),
		`{"type":"BOOKMARK","object":{"kind":"Widget","metadata":{"resourceVersion":"9"}}}`,
	}
	for _, e := range burst {
		u.events <- e
	}
	// Nothing comes through while the hold is in force: the upstream flushed every
	// event; give the proxy the time to (wrongly) hand one on.
	Eventually(t, 5*time.Second, func() (bool, string) {
		return !u.sentAt(burst[len(burst)-1]).IsZero(), "waiting for the upstream to send the burst"
	})
	got := make(chan string, 16)
	go func() {
		for {
			line, err := lines.ReadString('\n')
			if err != nil {
				close(got)
				return
			}
			got <- strings.TrimSpace(line)
		}
	}()
	waitHeld(t, p, len(burst))
	select {
	case line := <-got:
		t.Fatalf("an event came through the hold: %s", line)
	case <-time.After(200 * time.Millisecond):
	}
	stats := release()
	want := []string{watchEvent("MODIFIED", "w1", "u1", 7), watchEvent("ADDED", "w0", "u2", 8), burst[len(burst)-1]}
	for _, w := range want {
		select {
		case line := <-got:
			if line != w {
				t.Fatalf("after the hold: %s, want %s", line, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("after the hold: nothing, want %s", w)
		}
	}
	if stats.Held != len(burst) || stats.Delivered != len(want) {
		t.Fatalf("stats %+v, want %d held, %d delivered", stats, len(burst), len(want))
	}
	// Once released, events go through again.
	u.events <- watchEvent("MODIFIED", "w1", "u1", 10)
	if line := <-got; line != watchEvent("MODIFIED", "w1", "u1", 10) {
		t.Fatalf("after the hold ended: %s", line)
	}
}

// The next list of widgets is answered from a saved list (a watch that starts with
// the collection's objects gets them as ADDED events and the bookmark ending them),
// then, after the lag, the upstream's watch from the saved version; reads that must
// be consistent, and later lists, go to the upstream.
func TestProxyServesAStaleList(t *testing.T) {
	p, u, c := newTestProxy(t, ProxyOptions{})
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "WidgetList",
		"metadata": map[string]any{"resourceVersion": "5"}}}
	for _, name := range []string{"w0", "w1"} {
		list.Items = append(list.Items, unstructured.Unstructured{Object: map[string]any{"apiVersion": "examples.luaop.dev/v1", "kind": "Widget",
			"metadata": map[string]any{"namespace": "ns", "name": name, "resourceVersion": "4"}}})
	}
	p.ServeStaleList(func(r *http.Request) bool { return strings.Contains(r.URL.Path, "/widgets") }, list, 100*time.Millisecond)

	// A consistent list (no resourceVersion) is not answered from it.
	resp, err := c.Get(p.Env.Config.Host + widgetsPath)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if u.servedCount() != 1 || !p.StaleListPending() {
		t.Fatalf("a consistent list was answered from the saved list")
	}

	start := time.Now()
	resp, cancel, err := openWatch(t, p, c, "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=&allowWatchBookmarks=true")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	defer func() { _ = resp.Body.Close() }()
	lines := bufio.NewReader(resp.Body)
	var types []string
	for range 3 {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("the stale watch: %v (so far %v)", err, types)
		}
		var ev struct {
			Type   string
			Object unstructured.Unstructured
		}
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("the stale watch sent %q: %v", line, err)
		}
		types = append(types, ev.Type+" "+ev.Object.GetName()+" "+ev.Object.GetResourceVersion()+" "+ev.Object.GetAnnotations()["k8s.io/initial-events-end"])
	}
	if want := "ADDED w0 4 |ADDED w1 4 |BOOKMARK  5 true"; strings.Join(types, "|") != want {
		t.Fatalf("the stale watch began with %q, want %q", strings.Join(types, "|"), want)
	}
	u.events <- watchEvent("MODIFIED", "w0", "u0", 6)
	line, err := lines.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != watchEvent("MODIFIED", "w0", "u0", 6) {
		t.Fatalf("after the lag: %q, %v", line, err)
	}
	if since := time.Since(start); since < 100*time.Millisecond {
		t.Errorf("the upstream's watch came %s after the stale list, want the lag (100ms) at least", since)
	}
	u.mu.Lock()
	q := u.watches[len(u.watches)-1]
	u.mu.Unlock()
	if q.Get("resourceVersion") != "5" || q.Has("sendInitialEvents") || q.Has("resourceVersionMatch") {
		t.Fatalf("the upstream's watch was %v, want one from resourceVersion 5 without initial events", q)
	}
	if p.StaleListPending() {
		t.Fatalf("the saved list is still pending after serving a list")
	}
	reqs := p.Requests()
	if len(reqs) != 2 || reqs[0].Stale || !reqs[1].Stale {
		t.Fatalf("recorded %+v, want the consistent list forwarded, the watch answered stale", reqs)
	}
}

// A client that accepts a compressed stream (client-go does) gets the events
// through the proxy, which reads them (a hold coalesces them).
func TestProxyReadsACompressedWatch(t *testing.T) {
	p, u, c := newTestProxy(t, ProxyOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Env.Config.Host+widgetsPath+"?watch=true&resourceVersion=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", "gzip") // set by hand: the client does not inflate it
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var body io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		if body, err = gzip.NewReader(resp.Body); err != nil {
			t.Fatal(err)
		}
	}
	lines := bufio.NewReader(body)
	release := p.CoalesceWatchEvents(func(*http.Request) bool { return true })
	u.events <- watchEvent("ADDED", "w0", "u0", 2)
	u.events <- watchEvent("MODIFIED", "w0", "u0", 3)
	Eventually(t, 5*time.Second, func() (bool, string) {
		return !u.sentAt(watchEvent("MODIFIED", "w0", "u0", 3)).IsZero(), "waiting for the upstream to send"
	})
	waitHeld(t, p, 2)
	if stats := release(); stats.Held != 2 || stats.Delivered != 1 {
		t.Fatalf("the hold saw %+v of a compressed stream, want 2 held, 1 delivered", stats)
	}
	if line, err := lines.ReadString('\n'); err != nil || strings.TrimSpace(line) != watchEvent("MODIFIED", "w0", "u0", 3) {
		t.Fatalf("through the proxy: %q, %v", line, err)
	}
}

// waitHeld waits until the hold in force has kept n events back: the upstream having
// sent them does not mean the proxy's reader of that stream has read them yet.
func waitHeld(t *testing.T, p *Proxy, n int) {
	t.Helper()
	Eventually(t, 5*time.Second, func() (bool, string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.coalesce == nil {
			return false, "no hold in force"
		}
		return p.coalesce.stats.Held >= n, fmt.Sprintf("waiting for the proxy to hold %d events (%d so far)", n, p.coalesce.stats.Held)
	})
}
