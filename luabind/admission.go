package luabind

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"strings"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/luaop/luaop/luabind/internal/luaerr"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
)

// Admission handlers (luaop.on.validate, luaop.on.mutate) answer the API server's
// admission reviews, which the admission package receives. They run like every
// other call: on a thread of a shard (the object's shard when it has a uid, else
// one chosen by its name), under the caller's context, which carries the deadline
// below the webhook's timeout, and under the handler deadline; blocking functions
// release the shard.

// AdmissionRequest is one admission review for one handler.
type AdmissionRequest struct {
	// Handler is the validate or mutate handler to run (an AdmissionHandlers entry).
	Handler causes.Spec
	// Operation is CREATE, UPDATE, DELETE or CONNECT.
	Operation string
	// Object is request.object (nil on DELETE), OldObject request.oldObject
	// (UPDATE and DELETE).
	Object, OldObject map[string]any
	// UserInfo is request.userInfo (username, uid, groups, extra).
	UserInfo map[string]any
	// DryRun: the request does not persist; the handler's luaop.kube writes and
	// Events are logged, not sent.
	DryRun      bool
	Subresource string
	// Headers are the HTTP headers of the request (kopf's headers: ctx.headers);
	// SSLPeer the verified client certificate, nil without one (kopf's sslpeer:
	// ctx.sslpeer). See admission.Request.
	Headers map[string]string
	SSLPeer map[string]any
	// Logger receives ctx.logger and print output (defaults to the runtime's).
	Logger *slog.Logger
}

// AdmissionResponse is a handler's verdict.
type AdmissionResponse struct {
	// Skipped: the handler's filters (labels, annotations, field/value, when) do
	// not match the object: it did not run, and the request is allowed untouched.
	Skipped bool
	Allowed bool
	// Message and Code explain a rejection (Code 0: the API server's default, 403).
	Message string
	Code    int
	// Warnings are what the handler added to ctx.warnings.
	Warnings []string
	// Patch is what a mutate handler wrote into ctx.patch, as a JSON merge patch of
	// the object (luaop.null deletes a field); nil when it wrote nothing.
	Patch map[string]any
}

// AdmissionError rejects an admission request with a message and an HTTP code
// (luaop.admission_error; kopf's AdmissionError).
type AdmissionError = luaerr.AdmissionError

// admissionState is the admission part of a call (callState.adm).
type admissionState struct {
	req      *AdmissionRequest
	warnings *lua.LTable // ctx.warnings, made on first use
	second   lua.LValue  // the handler's second return value (a rejection's message)
}

// Admit runs one validate or mutate handler of the current generation on an
// admission request. A rejection (luaop.admission_error, or the handler returning
// false and a message) is a response with Allowed false; an error is a failure of
// the handler (a Lua error, its deadline or ctx ending, the handler removed by a
// reload), which the caller answers per the handler's failure policy. ctx should
// end before the webhook's timeout: the call then fails with it.
func (r *Runtime) Admit(ctx context.Context, req AdmissionRequest) (AdmissionResponse, error) {
	if !req.Handler.Kind.IsAdmission() {
		return AdmissionResponse{}, fmt.Errorf("handler %s is a %s handler, not an admission handler", req.Handler.ID, req.Handler.Kind)
	}
	if skippedOnDeletion(req.Handler, req.Operation) {
		return AdmissionResponse{Skipped: true, Allowed: true}, nil
	}
	body := req.Object
	if body == nil {
		body = req.OldObject // kopf: the body of a deletion is the old object
	}
	if body == nil {
		body = map[string]any{}
	}
	cause := causes.Cause{Resource: req.Handler.Resource, Body: body}
	if req.OldObject != nil && req.Object != nil {
		cause.Old, cause.New = req.OldObject, req.Object
	}
	f := r.gen.Load().filters[req.Handler.ID]
	if f != nil && !f.matchData(cause) {
		return AdmissionResponse{Skipped: true, Allowed: true}, nil
	}
	return withShard(ctx, func() *shard { return r.admissionShard(body) }, func(sh *shard) (AdmissionResponse, error) {
		return sh.admit(ctx, &req, cause, f)
	})
}

// skippedOnDeletion: a mutating handler does not run on a DELETE unless its
// operations are exactly DELETE (kopf's WebhooksRegistry.iter_handlers): there is
// nothing to mutate in an object being deleted, and a handler written for creations
// and updates (operations all, the default, or CREATE and DELETE) would otherwise
// patch it. The request is allowed untouched.
func skippedOnDeletion(spec causes.Spec, operation string) bool {
	if spec.Kind != causes.KindMutate || operation != "DELETE" {
		return false
	}
	for _, op := range spec.Operations {
		if op != "DELETE" {
			return true
		}
	}
	return len(spec.Operations) == 0
}

// admissionShard is the object's shard when it has a uid (ctx.memo is then the
// object's memo), else a shard chosen by namespace and name (creations).
func (r *Runtime) admissionShard(body map[string]any) *shard {
	if uid := uidOf(body); uid != "" {
		return r.shardFor(uid)
	}
	n := len(r.shards) - 1
	meta, _ := body["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	if name == "" {
		name, _ = meta["generateName"].(string)
	}
	h := fnv.New32a()
	h.Write([]byte(ns + "/" + name))
	return r.shards[h.Sum32()%uint32(n)].Load()
}

func (s *shard) admit(ctx context.Context, req *AdmissionRequest, cause causes.Cause, f *dataFilters) (AdmissionResponse, error) {
	if err := s.lock(ctx); err != nil {
		return AdmissionResponse{}, err
	}
	defer s.unlock()
	fns := s.fns[req.Handler.ID]
	if fns == nil {
		return AdmissionResponse{}, fmt.Errorf("handler %s is no longer registered (removed by a script reload)", req.Handler.ID)
	}
	logger := req.Logger
	if logger == nil {
		logger = s.rt.opts.Logger
	}
	call := causes.Call{Handler: req.Handler, Cause: cause, Logger: logger, Started: time.Now()}
	adm := &admissionState{req: req}
	if fns.hasFilter {
		ok, err := s.matchCallbacksAdm(ctx, req.Handler, fns, f, cause, adm)
		if err != nil {
			return AdmissionResponse{}, err
		}
		if !ok {
			return AdmissionResponse{Skipped: true, Allowed: true}, nil
		}
	}
	cs := &callState{call: call, fns: fns, logger: logger, ctx: ctx, adm: adm}
	ret, err := s.run(cs, fns.fn)
	defer s.endPatch(cs)
	resp := AdmissionResponse{Allowed: true, Warnings: adm.warningList()}
	var ae *AdmissionError
	switch {
	case errors.As(err, &ae):
		resp.Allowed, resp.Message, resp.Code = false, ae.Message, ae.Code
		return resp, nil
	case err != nil:
		return resp, err
	}
	if ret == lua.LFalse {
		resp.Allowed = false
		resp.Message = fmt.Sprintf("rejected by %s", req.Handler.ID)
		// The call has ended: no metamethod runs now (Describe runs none).
		if msg, ok := adm.second.(lua.LString); ok && msg != "" {
			resp.Message = luavalue.Cut(string(msg), luaerr.MaxMessage)
		} else if adm.second != nil && adm.second != lua.LNil {
			resp.Message = luavalue.Describe(adm.second, luaerr.MaxMessage)
		}
		return resp, nil
	}
	if req.Handler.Kind == causes.KindMutate && cs.patchTbl != nil {
		p, err := s.convertPatch(cs)
		if err != nil {
			return AdmissionResponse{}, fmt.Errorf("%s: ctx.patch: %w", req.Handler.Source, err)
		}
		if m, ok := p.(map[string]any); ok && len(m) > 0 {
			resp.Patch = m
		}
	}
	return resp, nil
}

// warningList reads ctx.warnings (strings; other values through tostring).
func (a *admissionState) warningList() []string {
	if a.warnings == nil {
		return nil
	}
	var out []string
	n := a.warnings.Len()
	for i := 1; i <= n; i++ {
		switch v := a.warnings.RawGetInt(i).(type) {
		case *lua.LNilType:
		case lua.LString:
			out = append(out, luavalue.Cut(string(v), luaerr.MaxMessage))
		default:
			out = append(out, luavalue.Describe(v, luaerr.MaxMessage))
		}
	}
	return out
}

// admissionField serves ctx.operation, userinfo, dryrun, subresource and warnings
// (nil outside admission handlers).
func (s *shard) admissionField(L *lua.LState, cs *callState, key string) lua.LValue {
	adm := cs.adm
	if adm == nil {
		return lua.LNil
	}
	switch key {
	case "operation":
		return lua.LString(adm.req.Operation)
	case "userinfo":
		if adm.req.UserInfo == nil {
			return luavalue.NewProxyNamed(L, map[string]any{}, "ctx.userinfo")
		}
		return luavalue.NewProxyNamed(L, adm.req.UserInfo, "ctx.userinfo")
	case "dryrun":
		return lua.LBool(adm.req.DryRun)
	case "subresource":
		if adm.req.Subresource == "" {
			return lua.LNil
		}
		return lua.LString(adm.req.Subresource)
	case "warnings":
		if adm.warnings == nil {
			adm.warnings = L.CreateTable(2, 0)
		}
		return adm.warnings
	case "headers":
		headers := make(map[string]any, len(adm.req.Headers))
		for k, v := range adm.req.Headers {
			headers[k] = v
		}
		return luavalue.NewProxyNamed(L, headers, "ctx.headers")
	case "sslpeer":
		if adm.req.SSLPeer == nil {
			return lua.LNil
		}
		return luavalue.NewProxyNamed(L, adm.req.SSLPeer, "ctx.sslpeer")
	}
	return lua.LNil
}

// admissionOverride serves the ctx fields that differ in admission calls: memo (a
// creation has no object yet, so no memo: a table for this call) and reason (none).
func (s *shard) admissionOverride(L *lua.LState, cs *callState, key string) lua.LValue {
	if key == "memo" {
		if uid := uidOf(cs.call.Cause.Body); uid != "" {
			return s.memoView(L, cs, uid)
		}
		return L.CreateTable(0, 0)
	}
	return lua.LNil
}

// checkAdmissionSpec validates the options of an admission handler at registration.
func checkAdmissionSpec(L *lua.LState, spec *causes.Spec, filters *dataFilters) {
	if spec.Timeout != 0 && (spec.Timeout < time.Second || spec.Timeout > 30*time.Second) {
		L.RaiseError("%s: option timeout = %g: the API server accepts 1 to 30 seconds for a webhook", spec.ID, spec.Timeout.Seconds())
	}
	// The static label filters become the webhook's objectSelector: one the API
	// server refuses would keep the whole configuration from being written.
	for _, m := range filters.labels {
		errs := validation.IsQualifiedName(m.key)
		if m.mode == metaEquals {
			errs = append(errs, validation.IsValidLabelValue(m.value)...)
		}
		if len(errs) > 0 {
			L.RaiseError("%s: labels filter %q = %q cannot be the webhook's objectSelector: %s (a label key is [prefix/]name, a value at most 63 letters, digits, '-', '_' or '.'; use a function(value, ctx) to match anything else)",
				spec.ID, m.key, m.value, strings.Join(errs, "; "))
		}
	}
}

// admissionOption reads operations, side_effects, failure_policy and subresource.
func (s *shard) admissionOption(L *lua.LState, spec *causes.Spec, name string, v lua.LValue) {
	switch name {
	case "operations":
		var ops []string
		add := func(x lua.LValue) {
			op, ok := x.(lua.LString)
			o := strings.ToUpper(string(op))
			if !ok || (o != "CREATE" && o != "UPDATE" && o != "DELETE" && o != "CONNECT" && o != "*") {
				L.RaiseError("option operations: use \"CREATE\", \"UPDATE\", \"DELETE\", \"CONNECT\" or a list of them, got %s", x.String())
			}
			ops = append(ops, o)
		}
		if t, ok := v.(*lua.LTable); ok {
			for i := 1; i <= t.Len(); i++ {
				add(t.RawGetInt(i))
			}
		} else {
			add(v)
		}
		spec.Operations = ops
	case "side_effects":
		b, ok := v.(lua.LBool)
		if !ok {
			L.RaiseError("option side_effects must be true (the handler writes elsewhere, except on dry runs) or false")
		}
		spec.SideEffects = bool(b)
	case "failure_policy":
		p := s.optString(L, name, v)
		if p != "Fail" && p != "Ignore" {
			L.RaiseError("option failure_policy = %q: use \"Fail\" (reject when the handler fails) or \"Ignore\" (allow, with a warning)", p)
		}
		spec.FailurePolicy = p
	case "subresource":
		spec.Subresource = s.optString(L, name, v)
	}
}

// installAdmissionError defines luaop.admission_error(message, code): raised with
// error(...) in a validate or mutate handler, it rejects the request with the
// message and the HTTP code (default 500, as kopf's AdmissionError).
func installAdmissionError(L *lua.LState, mod *lua.LTable) {
	mod.RawSetString("admission_error", L.NewFunction(func(L *lua.LState) int {
		if L.Get(1) == lua.LNil {
			L.ArgError(1, "message expected")
		}
		msg := luaerr.MessageArg(L, 1)
		code := 500
		if v := L.Get(2); v != lua.LNil {
			n, ok := v.(lua.LNumber)
			if !ok || math.IsNaN(float64(n)) || n < 100 || n > 599 {
				L.ArgError(2, "an HTTP status code (400, 403, 422, ...) expected")
			}
			code = int(n)
		}
		L.Push(luaerr.NewRaised(L, &AdmissionError{Message: msg, Code: code}))
		return 1
	}))
}

// LabelFilter is one label filter of a handler that needs no Lua: the label must
// exist (Present), must not (Absent), or must equal Value.
type LabelFilter struct {
	Key             string
	Present, Absent bool
	Value           string
}

// LabelFilters are the static label filters of a handler of the current generation
// (functions are left out): the admission package sends them to the API server as
// the webhook's objectSelector, as kopf does, so that it calls the webhook only for
// objects they may match.
func (r *Runtime) LabelFilters(id string) []LabelFilter {
	f := r.gen.Load().filters[id]
	if f == nil {
		return nil
	}
	out := make([]LabelFilter, 0, len(f.labels))
	for _, m := range f.labels {
		out = append(out, LabelFilter{Key: m.key, Present: m.mode == metaPresent, Absent: m.mode == metaAbsent, Value: m.value})
	}
	return out
}
