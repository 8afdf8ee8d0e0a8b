package testcluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
)

// Stage is where an intercepted request is: about to reach the upstream, or answered
// by it.
type Stage int

const (
	// BeforeUpstream: the proxy received the request and has not forwarded it.
	BeforeUpstream Stage = iota
	// AfterUpstream: the upstream answered (it applied a write it accepted); the
	// answer has not been relayed to the client yet.
	AfterUpstream
)

func (s Stage) String() string {
	if s == AfterUpstream {
		return "after"
	}
	return "before"
}

// Exchange is what an interceptor sees of a request (never a watch).
type Exchange struct {
	Stage   Stage
	Request *http.Request
	// Body is the request's body (empty for a GET).
	Body []byte
	// Status and Answer are the upstream's status code and body (AfterUpstream).
	Status int
	Answer []byte
}

// Verdict is what becomes of an intercepted request.
type Verdict int

const (
	// Forward lets the request go on (before), or relays the answer (after).
	Forward Verdict = iota
	// Cut cuts the client's connection instead: before, the request never reaches
	// the upstream; after, the upstream applied it and the client never learns so.
	// An interceptor that kills the client (a crash right before or right after a
	// call reaches kube-apiserver) cuts, so that nothing reaches a new process.
	Cut
)

// Interceptor is called for every request that is not a watch, before it is forwarded
// and once the upstream answered it, from the request's own goroutine: it may block
// (the request waits) and do anything, killing the client included, before it returns
// its verdict. It must be safe for concurrent use.
type Interceptor func(*Exchange) Verdict

// errCut is what ModifyResponse returns for an answer an interceptor cut.
var errCut = errors.New("cut by the proxy's interceptor")

type interceptedKey struct{}

// SetInterceptor installs an interceptor (nil: none) for the requests that come next.
func (p *Proxy) SetInterceptor(f Interceptor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.intercept = f
}

// CutRequests is how many requests (or answers) interceptors cut so far.
func (p *Proxy) CutRequests() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cut
}

// interceptRequest shows a request to the interceptor before it is forwarded. It
// returns the request to forward (its body read and put back, the interceptor
// remembered for its answer) and whether it was cut.
func (p *Proxy) interceptRequest(r *http.Request) (*http.Request, bool) {
	p.mu.Lock()
	f := p.intercept
	p.mu.Unlock()
	if f == nil {
		return r, false
	}
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		_ = r.Body.Close()
	}
	if f(&Exchange{Stage: BeforeUpstream, Request: r, Body: body}) == Cut {
		p.mu.Lock()
		p.cut++
		p.mu.Unlock()
		return r, true
	}
	r = r.WithContext(context.WithValue(r.Context(), interceptedKey{}, &Exchange{Request: r, Body: body}))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return r, false
}

// interceptAnswer shows the upstream's answer to the interceptor that saw its
// request, before it is relayed.
func (p *Proxy) interceptAnswer(resp *http.Response) error {
	seen, _ := resp.Request.Context().Value(interceptedKey{}).(*Exchange)
	if seen == nil {
		return nil
	}
	p.mu.Lock()
	f := p.intercept
	p.mu.Unlock()
	if f == nil {
		return nil
	}
	answer, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		return err
	}
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	if f(&Exchange{Stage: AfterUpstream, Request: seen.Request, Body: seen.Body, Status: resp.StatusCode, Answer: answer}) == Cut {
		p.mu.Lock()
		p.cut++
		p.mu.Unlock()
		return errCut
	}
	return nil
}
