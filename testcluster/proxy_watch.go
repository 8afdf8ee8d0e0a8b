package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A watch's stream goes through an eventStream, which decodes it into events (one
// JSON object each, as kube-apiserver sends them) and hands them on one by one, or,
// while CoalesceWatchEvents holds the stream, keeps only the last event of each object:
// the client sees the end of a burst of changes and none of the states in between
// (Sieve's "intermediate states": a delete and re-create under one name is one
// MODIFIED event of an object whose uid changed).
type eventStream struct {
	p    *Proxy
	req  *http.Request
	body io.ReadCloser // the upstream's
	pr   *io.PipeReader
	pw   *io.PipeWriter
	wake chan struct{} // a hold ended: flush

	// Owned by run.
	held  []heldEvent
	index map[string]int // object -> its place in held
}

type heldEvent struct {
	key  string
	data []byte
}

// coalescing is a hold in force.
type coalescing struct {
	match func(*http.Request) bool
	stats *CoalesceStats
}

// CoalesceStats counts what a hold did.
type CoalesceStats struct {
	// Held is how many events the hold kept back; Delivered, how many of them it
	// delivers when it ends (the last of each object's, per watch).
	Held, Delivered int
}

func (p *Proxy) newEventStream(req *http.Request, body io.ReadCloser) io.ReadCloser {
	pr, pw := io.Pipe()
	s := &eventStream{p: p, req: req, body: body, pr: pr, pw: pw, wake: make(chan struct{}, 1), index: map[string]int{}}
	p.mu.Lock()
	p.streams[s] = struct{}{}
	p.mu.Unlock()
	go s.run()
	return s
}

func (s *eventStream) Read(b []byte) (int, error) { return s.pr.Read(b) }

func (s *eventStream) Close() error {
	err := s.body.Close()
	_ = s.pr.Close()
	return err
}

// run decodes the upstream's events and writes each on, or holds it.
func (s *eventStream) run() {
	defer func() {
		s.p.mu.Lock()
		delete(s.p.streams, s)
		s.p.mu.Unlock()
	}()
	events := make(chan []byte)
	failed := make(chan error, 1)
	go func() {
		dec := json.NewDecoder(s.body)
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				failed <- err
				return
			}
			select {
			case events <- raw:
			case <-s.req.Context().Done():
				failed <- s.req.Context().Err()
				return
			}
		}
	}()
	for {
		select {
		case data := <-events:
			if hold := s.p.holdOf(s.req); hold != nil {
				s.keep(data, hold)
				continue
			}
			if err := s.flush(); err != nil {
				return
			}
			if err := s.write(data); err != nil {
				return
			}
		case <-s.wake:
			if s.p.holdOf(s.req) == nil {
				if err := s.flush(); err != nil {
					return
				}
			}
		case err := <-failed:
			if s.p.holdOf(s.req) == nil {
				_ = s.flush()
			}
			if err == io.EOF {
				err = nil
			}
			_ = s.pw.CloseWithError(err)
			return
		}
	}
}

func (s *eventStream) write(data []byte) error {
	_, err := s.pw.Write(append(append(make([]byte, 0, len(data)+1), data...), '\n'))
	return err
}

// keep holds an event back in place of the one before it of the same object.
func (s *eventStream) keep(data []byte, hold *coalescing) {
	key := eventKey(data)
	i, replaces := s.index[key]
	s.p.mu.Lock()
	hold.stats.Held++
	if !replaces {
		hold.stats.Delivered++
	}
	s.p.mu.Unlock()
	if replaces {
		// The object's last event moves to the end: events go out in the order of
		// the objects' last changes, as a watch that resumed later would show them.
		s.held = append(s.held[:i], s.held[i+1:]...)
		for k, j := range s.index {
			if j > i {
				s.index[k] = j - 1
			}
		}
	}
	s.index[key] = len(s.held)
	s.held = append(s.held, heldEvent{key: key, data: data})
}

// flush writes what a hold kept, once it is over.
func (s *eventStream) flush() error {
	if len(s.held) == 0 {
		return nil
	}
	held := s.held
	s.held, s.index = nil, map[string]int{}
	for _, e := range held {
		if err := s.write(e.data); err != nil {
			return err
		}
	}
	return nil
}

// eventKey names the object of a watch event: namespace/name (so a re-created object
// replaces the deleted one), "bookmark" or "error".
func eventKey(data []byte) string {
	var ev struct {
		Type   string `json:"type"`
		Object struct {
			Metadata struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"metadata"`
		} `json:"object"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return "undecodable"
	}
	switch ev.Type {
	case "BOOKMARK", "ERROR":
		return strings.ToLower(ev.Type)
	}
	return ev.Object.Metadata.Namespace + "/" + ev.Object.Metadata.Name
}

// holdOf is the hold in force over a watch, or nil.
func (p *Proxy) holdOf(r *http.Request) *coalescing {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.coalesce != nil && p.coalesce.match(r) {
		return p.coalesce
	}
	return nil
}

// CoalesceWatchEvents holds back the events of the matching watches, running and
// new, keeping only the last event of each object, until the function it returns is
// called: then each object's last event is delivered, in the order of the objects'
// last changes, and the function returns what the hold did. One hold at a time: a
// second call replaces the first's match (both end with either's release).
func (p *Proxy) CoalesceWatchEvents(match func(*http.Request) bool) (release func() CoalesceStats) {
	p.mu.Lock()
	hold := &coalescing{match: match, stats: &CoalesceStats{}}
	p.coalesce = hold
	p.mu.Unlock()
	var once sync.Once
	return func() CoalesceStats {
		once.Do(func() {
			p.mu.Lock()
			if p.coalesce == hold {
				p.coalesce = nil
			}
			streams := make([]*eventStream, 0, len(p.streams))
			for s := range p.streams {
				streams = append(streams, s)
			}
			p.mu.Unlock()
			for _, s := range streams {
				select {
				case s.wake <- struct{}{}:
				default:
				}
			}
		})
		p.mu.Lock()
		defer p.mu.Unlock()
		return *hold.stats
	}
}

// staleList is a saved list the proxy answers one list with (ServeStaleList).
type staleList struct {
	match func(*http.Request) bool
	list  *unstructured.UnstructuredList
	lag   time.Duration
}

// ServeStaleList makes the proxy answer the next matching request that lists a
// collection from scratch (a watch with sendInitialEvents=true, what client-go's
// informers start with, or a list with resourceVersion=0, which any API server may
// answer from its watch cache) from list, a state the test saved earlier, as a lagging
// watch cache or a second API server that is behind would: a watch gets the list's
// objects as ADDED events and the bookmark that ends the initial events, at the list's
// resourceVersion; then, lag later, the server's own watch from that resourceVersion,
// which replays what changed since. Reads that must be consistent (no resourceVersion)
// are never answered from it. One request is served so; later ones go to the server.
func (p *Proxy) ServeStaleList(match func(*http.Request) bool, list *unstructured.UnstructuredList, lag time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stale = &staleList{match: match, list: list.DeepCopy(), lag: lag}
}

// StaleListPending tells whether a saved list still waits for its request.
func (p *Proxy) StaleListPending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stale != nil
}

// takeStale returns the saved list r is to be answered from, once.
func (p *Proxy) takeStale(r *http.Request) *staleList {
	if r.Method != http.MethodGet {
		return nil
	}
	q := r.URL.Query()
	initial := IsWatch(r) && q.Get("sendInitialEvents") == "true" || !IsWatch(r) && q.Get("resourceVersion") == "0"
	if !initial {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stale
	if s == nil || !s.match(r) {
		return nil
	}
	p.stale = nil
	return s
}

func (p *Proxy) serveStale(w http.ResponseWriter, r *http.Request, s *staleList) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache, private")
	if !IsWatch(r) {
		data, _ := s.list.MarshalJSON()
		_, _ = w.Write(data)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	aw := &activeWatch{req: r, cancel: cancel}
	p.mu.Lock()
	p.active[aw] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.active, aw)
		p.mu.Unlock()
	}()
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, item := range s.list.Items {
		_ = enc.Encode(map[string]any{"type": "ADDED", "object": item.Object})
	}
	rv := s.list.GetResourceVersion()
	_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{
		"apiVersion": s.list.GetAPIVersion(), "kind": strings.TrimSuffix(s.list.GetKind(), "List"),
		"metadata": map[string]any{"resourceVersion": rv, "annotations": map[string]any{"k8s.io/initial-events-end": "true"}},
	}})
	_, _ = w.Write(buf.Bytes())
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	select {
	case <-time.After(s.lag):
	case <-ctx.Done():
		return
	}
	// The rest of the watch is the server's, from the saved version: what changed
	// since comes as events, in order.
	u := *r.URL
	q := u.Query()
	q.Del("sendInitialEvents")
	q.Del("resourceVersionMatch")
	q.Set("resourceVersion", rv)
	q.Set("allowWatchBookmarks", "true")
	u.RawQuery = q.Encode()
	rest := r.Clone(ctx)
	rest.URL = &u
	rest.RequestURI = u.RequestURI()
	p.rp.ServeHTTP(headersSent{w}, rest)
}

// headersSent is a ResponseWriter whose headers went out already: the reverse proxy's
// own are dropped, its body goes on.
type headersSent struct{ w http.ResponseWriter }

func (h headersSent) Header() http.Header         { return http.Header{} }
func (h headersSent) WriteHeader(int)             {}
func (h headersSent) Write(b []byte) (int, error) { return h.w.Write(b) }
func (h headersSent) Flush() {
	if f, ok := h.w.(http.Flusher); ok {
		f.Flush()
	}
}
