package admission

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
)

// Request is one admission request as a handler sees it.
type Request struct {
	// Operation is CREATE, UPDATE, DELETE or CONNECT.
	Operation string
	// Object is request.object (nil on DELETE), OldObject request.oldObject.
	Object, OldObject map[string]any
	UserInfo          map[string]any
	DryRun            bool
	Subresource       string
	Namespace, Name   string
	Resource          metav1.GroupVersionResource
	// Headers are the HTTP headers of the review's request (kopf's headers), one
	// value per name (repeated ones joined with ", "), names in Go's canonical form
	// ("User-Agent"). SSLPeer is the client's TLS certificate, when it gave one and
	// it was verified (kopf's sslpeer; see Options.ClientCA): nil otherwise.
	Headers map[string]string
	SSLPeer map[string]any
}

// Response is a handler's verdict.
type Response struct {
	Allowed bool
	// Message and Code explain a rejection (Code 0: the API server's 403).
	Message  string
	Code     int
	Warnings []string
	// Patch (mutate handlers) is a JSON merge patch of the object; the Server sends
	// it as the equivalent JSON patch.
	Patch map[string]any
}

// AdmitFunc decides on a request. An error is a failure of the handler, answered
// per its failure policy; a rejection is a Response with Allowed false.
type AdmitFunc func(ctx context.Context, req Request) (Response, error)

// Handler is one webhook: a Lua handler of the scripts, or a Go one given to
// Webhooks.Register.
type Handler struct {
	// ID names the handler; with Kind it makes the webhook's path and name.
	ID   string
	Kind causes.Kind // causes.KindValidate or causes.KindMutate
	// Rules say which requests the API server sends. Without them the Syncer
	// derives one rule from Resource (as a script spells it, resolved through
	// discovery), Operations (default all) and Subresource.
	Rules       []admissionregistrationv1.RuleWithOperations
	Resource    causes.Resource
	Operations  []string
	Subresource string
	// FailurePolicy is "Fail" (default) or "Ignore"; Timeout the webhook's
	// timeoutSeconds (default 10s); SideEffects: NoneOnDryRun instead of None.
	FailurePolicy string
	Timeout       time.Duration
	SideEffects   bool
	// ObjectSelector and NamespaceSelector narrow the requests (optional).
	ObjectSelector, NamespaceSelector *metav1.LabelSelector
	// Source is where the handler was registered (file:line), for messages.
	Source string
	Admit  AdmitFunc
}

// Path is the URL path the Server serves the handler on.
func (h Handler) Path() string { return "/" + string(h.Kind) + "/" + h.ID }

// WebhookPath is the path the configurations give the API server: Path behind
// the failure policy ("/fail/validate/x", "/ignore/validate/x"), so that a request
// for a handler that is gone (removed by a reload, a stale configuration) is
// still answered per the policy it was written with. (The API server accepts no
// query in a webhook's URL.)
func (h Handler) WebhookPath() string {
	if h.ignore() {
		return ignorePrefix + h.Path()
	}
	return failPrefix + h.Path()
}

const failPrefix, ignorePrefix = "/fail", "/ignore"

// splitPolicy takes the failure policy off a request's path: "Fail", "Ignore",
// or "" for a bare Path (a configuration written by an earlier luaop).
func splitPolicy(path string) (policy, rest string) {
	if r, ok := strings.CutPrefix(path, failPrefix+"/"); ok {
		return "Fail", "/" + r
	}
	if r, ok := strings.CutPrefix(path, ignorePrefix+"/"); ok {
		return "Ignore", "/" + r
	}
	return "", path
}

// DefaultTimeout is the API server's default webhook timeout.
const DefaultTimeout = 10 * time.Second

// timeout is the webhook's timeoutSeconds as the API server applies it: whole
// seconds (a fraction is rounded down, at least 1 s, at most 30 s). Everything
// derived from the timeout (the configuration, the handler's deadline) is
// computed from this one value.
func (h Handler) timeout() time.Duration {
	t := h.Timeout
	switch {
	case t <= 0:
		return DefaultTimeout
	case t < time.Second:
		return time.Second
	case t > MaxTimeout:
		return MaxTimeout
	}
	return t.Truncate(time.Second)
}

// MaxTimeout is the largest webhook timeout the API server accepts.
const MaxTimeout = 30 * time.Second

// deadline is how long the handler may run: 4/5 of the webhook's timeout, so that
// the answer reaches the API server before it gives up.
func (h Handler) deadline() time.Duration { return h.timeout() - h.timeout()/5 }

func (h Handler) ignore() bool { return h.FailurePolicy == "Ignore" }

// Server answers admission reviews. Its zero value is not usable: NewServer.
type Server struct {
	log *slog.Logger
	rt  atomic.Pointer[luabind.Runtime]
	mu  sync.Mutex // guards goHandlers (a leaf lock)
	// goHandlers are the handlers registered from Go, by path.
	goHandlers map[string]Handler
}

// NewServer makes a Server serving the Lua handlers of rt (nil: none yet).
func NewServer(rt *luabind.Runtime, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{log: log, goHandlers: map[string]Handler{}}
	if rt != nil {
		s.rt.Store(rt)
	}
	return s
}

// Register adds (or replaces, by kind and id) a Go handler.
func (s *Server) Register(h Handler) error {
	if !h.Kind.IsAdmission() || h.ID == "" || h.Admit == nil {
		return fmt.Errorf("admission handler %q: needs an ID, Kind validate or mutate, and Admit", h.ID)
	}
	if h.Timeout != 0 && (h.Timeout < time.Second || h.Timeout > MaxTimeout) {
		return fmt.Errorf("admission handler %q: Timeout %s: the API server accepts 1 to 30 seconds for a webhook (0: the default %s)", h.ID, h.Timeout, DefaultTimeout)
	}
	s.mu.Lock()
	s.goHandlers[h.Path()] = h
	s.mu.Unlock()
	return nil
}

// Handlers are the handlers served now: the Go ones, then the Lua ones of the
// current script generation (whose Rules the Syncer fills in).
func (s *Server) Handlers() []Handler {
	s.mu.Lock()
	out := make([]Handler, 0, len(s.goHandlers))
	for _, h := range s.goHandlers {
		out = append(out, h)
	}
	s.mu.Unlock()
	sortHandlers(out)
	if rt := s.rt.Load(); rt != nil {
		for _, spec := range rt.AdmissionHandlers() {
			out = append(out, luaHandler(rt, spec, s.log))
		}
	}
	return out
}

// lookup finds the handler of a path at the time of the request.
func (s *Server) lookup(path string) (Handler, bool) {
	s.mu.Lock()
	h, ok := s.goHandlers[path]
	s.mu.Unlock()
	if ok {
		return h, true
	}
	if rt := s.rt.Load(); rt != nil {
		for _, spec := range rt.AdmissionHandlers() {
			if lh := luaHandler(rt, spec, s.log); lh.Path() == path {
				return lh, true
			}
		}
	}
	return Handler{}, false
}

// serves tells whether a handler serves path now.
func (s *Server) serves(path string) bool {
	_, ok := s.lookup(path)
	return ok
}

// luaHandler makes the Handler of a Lua validate or mutate handler; its ctx.logger
// writes to log (the server's: the operator's log).
func luaHandler(rt *luabind.Runtime, spec causes.Spec, log *slog.Logger) Handler {
	return Handler{ID: spec.ID, Kind: spec.Kind, FailurePolicy: spec.FailurePolicy, Timeout: spec.Timeout,
		SideEffects: spec.SideEffects, Source: spec.Source, Resource: spec.Resource, Operations: spec.Operations,
		Subresource: spec.Subresource, ObjectSelector: objectSelector(rt.LabelFilters(spec.ID)),
		Admit: func(ctx context.Context, req Request) (Response, error) {
			r, err := rt.Admit(ctx, luabind.AdmissionRequest{Handler: spec, Operation: req.Operation,
				Object: req.Object, OldObject: req.OldObject, UserInfo: req.UserInfo, DryRun: req.DryRun,
				Subresource: req.Subresource, Headers: req.Headers, SSLPeer: req.SSLPeer, Logger: log.With("handler", spec.ID,
					"object", objectName(req), "operation", req.Operation)})
			return Response{Allowed: r.Allowed, Message: r.Message, Code: r.Code, Warnings: r.Warnings, Patch: r.Patch}, err
		}}
}

func objectName(req Request) string {
	if req.Namespace != "" {
		return req.Namespace + "/" + req.Name
	}
	return req.Name
}

// maxReviewBytes bounds a review's body (the API server's own limit is 3 MiB
// objects; a review carries two).
const maxReviewBytes = 8 << 20

// ServeHTTP answers one AdmissionReview (admission.k8s.io/v1) on a handler's path.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "admission reviews are POSTed", http.StatusMethodNotAllowed)
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes))
	if err != nil {
		http.Error(w, "reading the review: "+err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(data, &review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview with a request: %v", err), http.StatusBadRequest)
		return
	}
	resp := s.review(r.Context(), r.URL.Path, review.Request, transportOf(r))
	out := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// review runs the handler of path on a request and builds the response.
func (s *Server) review(ctx context.Context, path string, ar *admissionv1.AdmissionRequest, from transport) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: ar.UID}
	policy, path := splitPolicy(path)
	h, ok := s.lookup(path)
	if !ok {
		// A handler removed by a reload (until the configurations follow) or a
		// stale configuration: answered per the failure policy the webhook was
		// written with, Fail when the path does not say (the API server's default).
		msg := fmt.Sprintf("luaop serves no admission handler at %s (removed by a reload, or a stale webhook configuration); the configurations are synced again shortly, or delete the webhook if no handler should answer", path)
		if policy == "Ignore" {
			s.log.Warn(msg+"; allowed (failure_policy Ignore)", "path", path)
			resp.Allowed = true
			resp.Warnings = []string{"luaop: " + msg + "; allowed (failure_policy Ignore)"}
			return resp
		}
		s.log.Error(msg+"; rejected (failure_policy Fail)", "path", path)
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Message: msg + "; rejected (failure_policy Fail)", Code: http.StatusInternalServerError}
		return resp
	}
	req, err := decodeRequest(ar)
	if err != nil {
		return s.failed(h, resp, err)
	}
	req.Headers, req.SSLPeer = from.headers, from.sslPeer
	ctx, cancel := context.WithTimeout(ctx, h.deadline())
	defer cancel()
	type outcome struct {
		r   Response
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- outcome{err: fmt.Errorf("internal error: %v", p)}
			}
		}()
		r, err := h.Admit(ctx, req)
		done <- outcome{r, err}
	}()
	var out outcome
	select {
	case out = <-done:
	case <-ctx.Done():
		// Never hold the API server past the webhook's timeout: the handler ends
		// with ctx on its own; its late answer is dropped.
		out.err = fmt.Errorf("no answer within %s (the webhook's timeout is %s): %w", h.deadline(), h.timeout(), ctx.Err())
	}
	if out.err != nil {
		return s.failed(h, resp, out.err)
	}
	resp.Allowed = out.r.Allowed
	resp.Warnings = out.r.Warnings
	if !out.r.Allowed {
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Message: out.r.Message, Code: int32(out.r.Code)}
		if out.r.Code == 0 {
			resp.Result.Code = http.StatusForbidden
		}
		s.log.Info("admission rejected", "handler", h.ID, "object", objectName(req), "operation", req.Operation, "message", out.r.Message, "dry_run", req.DryRun)
		return resp
	}
	if h.Kind == causes.KindMutate && len(out.r.Patch) > 0 && req.Object != nil {
		ops, err := jsonPatch(ar.Object.Raw, out.r.Patch)
		if err != nil {
			return s.failed(h, resp, fmt.Errorf("making the JSON patch of ctx.patch: %w", err))
		}
		if len(ops) > 0 {
			raw, err := json.Marshal(ops)
			if err != nil {
				return s.failed(h, resp, err)
			}
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = raw, &pt
		}
	}
	return resp
}

// transport is what the HTTP request says about a review besides its body.
type transport struct {
	headers map[string]string
	sslPeer map[string]any
}

func transportOf(r *http.Request) transport {
	t := transport{headers: make(map[string]string, len(r.Header))}
	for name, values := range r.Header {
		t.headers[name] = strings.Join(values, ", ")
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		t.sslPeer = peerCertificate(r.TLS.VerifiedChains[0][0])
	}
	return t
}

// peerCertificate describes a client certificate as kopf's sslpeer does (Python's
// ssl getpeercert(), with its attribute names): subject and issuer by attribute
// (commonName and serialNumber strings; organizationName, organizationalUnitName,
// countryName, localityName, stateOrProvinceName, streetAddress, postalCode lists, as
// a name may hold several), serialNumber (upper-case hex), notBefore and notAfter
// (RFC 3339), version, and subjectAltName as a list of {type, value} pairs ("DNS",
// "IP Address", "email", "URI").
func peerCertificate(c *x509.Certificate) map[string]any {
	name := func(n pkix.Name) map[string]any {
		out := map[string]any{}
		lists := map[string][]string{"countryName": n.Country, "organizationName": n.Organization,
			"organizationalUnitName": n.OrganizationalUnit, "localityName": n.Locality,
			"stateOrProvinceName": n.Province, "streetAddress": n.StreetAddress, "postalCode": n.PostalCode}
		for k, v := range lists {
			if len(v) > 0 {
				vals := make([]any, len(v))
				for i, x := range v {
					vals[i] = x
				}
				out[k] = vals
			}
		}
		if n.CommonName != "" {
			out["commonName"] = n.CommonName
		}
		if n.SerialNumber != "" {
			out["serialNumber"] = n.SerialNumber
		}
		return out
	}
	var alt []any
	for _, d := range c.DNSNames {
		alt = append(alt, []any{"DNS", d})
	}
	for _, ip := range c.IPAddresses {
		alt = append(alt, []any{"IP Address", ip.String()})
	}
	for _, e := range c.EmailAddresses {
		alt = append(alt, []any{"email", e})
	}
	for _, u := range c.URIs {
		alt = append(alt, []any{"URI", u.String()})
	}
	out := map[string]any{
		"subject": name(c.Subject), "issuer": name(c.Issuer), "version": int64(c.Version),
		"serialNumber": strings.ToUpper(c.SerialNumber.Text(16)),
		"notBefore":    c.NotBefore.UTC().Format(time.RFC3339), "notAfter": c.NotAfter.UTC().Format(time.RFC3339),
	}
	if len(alt) > 0 {
		out["subjectAltName"] = alt
	}
	return out
}

// failed answers per the handler's failure policy.
func (s *Server) failed(h Handler, resp *admissionv1.AdmissionResponse, err error) *admissionv1.AdmissionResponse {
	msg := fmt.Sprintf("admission handler %s failed: %v", h.ID, err)
	if h.ignore() {
		s.log.Warn(msg+"; allowed (failure_policy Ignore)", "handler", h.ID)
		resp.Allowed = true
		resp.Warnings = append(resp.Warnings, "luaop: "+msg+"; allowed (failure_policy Ignore)")
		return resp
	}
	s.log.Error(msg+"; rejected (failure_policy Fail)", "handler", h.ID)
	resp.Allowed = false
	resp.Warnings = nil
	resp.Result = &metav1.Status{Status: metav1.StatusFailure, Message: msg, Code: http.StatusInternalServerError}
	return resp
}

// decodeRequest converts the review's request into a Request.
func decodeRequest(ar *admissionv1.AdmissionRequest) (Request, error) {
	req := Request{Operation: string(ar.Operation), Subresource: ar.SubResource, Namespace: ar.Namespace, Name: ar.Name,
		Resource: ar.Resource, DryRun: ar.DryRun != nil && *ar.DryRun}
	var err error
	if req.Object, err = decodeObject(ar.Object.Raw); err != nil {
		return req, fmt.Errorf("request.object: %w", err)
	}
	if req.OldObject, err = decodeObject(ar.OldObject.Raw); err != nil {
		return req, fmt.Errorf("request.oldObject: %w", err)
	}
	ui := map[string]any{"username": ar.UserInfo.Username}
	if ar.UserInfo.UID != "" {
		ui["uid"] = ar.UserInfo.UID
	}
	if len(ar.UserInfo.Groups) > 0 {
		groups := make([]any, len(ar.UserInfo.Groups))
		for i, g := range ar.UserInfo.Groups {
			groups[i] = g
		}
		ui["groups"] = groups
	}
	if len(ar.UserInfo.Extra) > 0 {
		extra := map[string]any{}
		for k, v := range ar.UserInfo.Extra {
			vals := make([]any, len(v))
			for i, x := range v {
				vals[i] = x
			}
			extra[k] = vals
		}
		ui["extra"] = extra
	}
	req.UserInfo = ui
	if req.Name == "" && req.Object != nil {
		meta, _ := req.Object["metadata"].(map[string]any)
		req.Name, _ = meta["name"].(string)
		if req.Name == "" {
			req.Name, _ = meta["generateName"].(string)
		}
	}
	return req, nil
}

// decodeObject decodes a raw object keeping integers integral (json.Number
// converted to int64 where it fits, as the rest of luaop sees objects).
func decodeObject(raw []byte) (map[string]any, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	m, ok := numbersToGo(v).(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a JSON object")
	}
	return m, nil
}

func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

func numbersToGo(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = numbersToGo(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = numbersToGo(e)
		}
		return x
	case json.Number:
		if !strings.ContainsAny(string(x), ".eE") {
			if n, err := x.Int64(); err == nil {
				return n
			}
		}
		f, _ := x.Float64()
		return f
	}
	return v
}

func sortHandlers(hs []Handler) {
	sort.Slice(hs, func(i, j int) bool { return hs[i].Path() < hs[j].Path() })
}

// objectSelector turns a handler's static label filters into the webhook's
// objectSelector (kopf's), nil when there are none.
func objectSelector(filters []luabind.LabelFilter) *metav1.LabelSelector {
	if len(filters) == 0 {
		return nil
	}
	sel := &metav1.LabelSelector{}
	for _, f := range filters {
		r := metav1.LabelSelectorRequirement{Key: f.Key, Operator: metav1.LabelSelectorOpIn, Values: []string{f.Value}}
		switch {
		case f.Present:
			r = metav1.LabelSelectorRequirement{Key: f.Key, Operator: metav1.LabelSelectorOpExists}
		case f.Absent:
			r = metav1.LabelSelectorRequirement{Key: f.Key, Operator: metav1.LabelSelectorOpDoesNotExist}
		}
		sel.MatchExpressions = append(sel.MatchExpressions, r)
	}
	sort.Slice(sel.MatchExpressions, func(i, j int) bool { return sel.MatchExpressions[i].Key < sel.MatchExpressions[j].Key })
	return sel
}
