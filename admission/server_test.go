package admission

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing/causes"
)

const testScript = `
local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx)
  if (ctx.spec.size or 0) > 10 then
    error(luaop.admission_error("spec.size must be at most 10", 422))
  end
  if ctx.spec.size == 0 then return false, "spec.size must not be 0" end
  if ctx.spec.size == 9 then error("boom") end
  if ctx.dryrun then table.insert(ctx.warnings, "dry run by " .. ctx.userinfo.username) end
end, {id = "size"})

luaop.on.validate("example.com/v1/widgets", function(ctx) error("broken") end, {id = "lenient", failure_policy = "Ignore"})

luaop.on.validate("example.com/v1/widgets", function(ctx)
  while true do end
end, {id = "spin", timeout = 1})

luaop.on.mutate("example.com/v1/widgets", function(ctx)
  if ctx.spec.color == nil then ctx.patch.spec.color = "blue" end
  ctx.patch.metadata.labels["example.com/mutated"] = "yes"
  ctx.patch.spec.obsolete = luaop.null
end, {id = "defaults"})
`

func testRuntime(t *testing.T, src string) *luabind.Runtime {
	t.Helper()
	rt := luabind.New(luabind.Options{Shards: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(rt.Close)
	if _, err := rt.Load(t.Context(), []luabind.Script{{Name: "widgets.lua", Source: []byte(src)}}); err != nil {
		t.Fatal(err)
	}
	return rt
}

func widget(spec string) []byte {
	return []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"default"},"spec":` + spec + `}`)
}

// post sends an AdmissionReview to path and decodes the answer.
func post(t *testing.T, url, path string, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	body, _ := json.Marshal(admissionv1.AdmissionReview{Request: req})
	resp, err := http.Post(url+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&review); err != nil {
		t.Fatal(err)
	}
	if review.Response == nil || review.Response.UID != req.UID || review.Kind != "AdmissionReview" {
		t.Fatalf("answer %+v: want the request's uid %q in an AdmissionReview", review, req.UID)
	}
	return review.Response
}

func request(op admissionv1.Operation, obj []byte) *admissionv1.AdmissionRequest {
	return &admissionv1.AdmissionRequest{UID: types.UID("uid-" + string(op)), Operation: op, Namespace: "default", Name: "w1",
		Object: runtime.RawExtension{Raw: obj}, UserInfo: authenticationv1.UserInfo{Username: "alice", Groups: []string{"devs"}}}
}

func TestServeValidate(t *testing.T) {
	srv := NewServer(testRuntime(t, testScript), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ts := httptest.NewServer(srv)
	defer ts.Close()
	dry := true
	for _, tc := range []struct {
		name, path string
		req        *admissionv1.AdmissionRequest
		allowed    bool
		message    string
		code       int32
		warning    string
	}{
		{name: "allowed", path: "/validate/size", req: request("CREATE", widget(`{"size":3}`)), allowed: true},
		{name: "admission_error", path: "/validate/size", req: request("CREATE", widget(`{"size":11}`)),
			message: "spec.size must be at most 10", code: 422},
		{name: "return false", path: "/validate/size", req: request("UPDATE", widget(`{"size":0}`)),
			message: "spec.size must not be 0", code: 403},
		{name: "dry run", path: "/validate/size", req: func() *admissionv1.AdmissionRequest {
			r := request("CREATE", widget(`{"size":1}`))
			r.DryRun = &dry
			return r
		}(), allowed: true, warning: "dry run by alice"},
		{name: "error, policy Fail", path: "/validate/size", req: request("CREATE", widget(`{"size":9}`)),
			message: "admission handler size failed: widgets.lua:8: boom", code: 500},
		{name: "error, policy Ignore", path: "/validate/lenient", req: request("CREATE", widget(`{}`)), allowed: true,
			warning: "admission handler lenient failed: widgets.lua:12: broken; allowed (failure_policy Ignore)"},
		{name: "synced path", path: "/fail/validate/size", req: request("CREATE", widget(`{"size":11}`)),
			message: "spec.size must be at most 10", code: 422},
		{name: "synced path, policy Ignore", path: "/ignore/validate/lenient", req: request("CREATE", widget(`{}`)), allowed: true,
			warning: "admission handler lenient failed: widgets.lua:12: broken; allowed (failure_policy Ignore)"},
		// A handler gone (a reload removed it; a stale configuration): answered per
		// the failure policy its webhook was written with.
		{name: "unknown handler, policy Fail", path: "/fail/validate/gone", req: request("CREATE", widget(`{}`)),
			message: "luaop serves no admission handler at /validate/gone (removed by a reload, or a stale webhook configuration); the configurations are synced again shortly, or delete the webhook if no handler should answer; rejected (failure_policy Fail)", code: 500},
		{name: "unknown handler, policy Ignore", path: "/ignore/validate/gone", req: request("CREATE", widget(`{}`)), allowed: true,
			warning: "luaop serves no admission handler at /validate/gone"},
		{name: "unknown handler, no policy in the path", path: "/validate/gone", req: request("CREATE", widget(`{}`)),
			message: "luaop serves no admission handler at /validate/gone (removed by a reload, or a stale webhook configuration); the configurations are synced again shortly, or delete the webhook if no handler should answer; rejected (failure_policy Fail)", code: 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(t, ts.URL, tc.path, tc.req)
			if got.Allowed != tc.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", got.Allowed, tc.allowed, got.Result)
			}
			if !tc.allowed && (got.Result == nil || got.Result.Message != tc.message || got.Result.Code != tc.code) {
				t.Errorf("result = %+v, want message %q code %d", got.Result, tc.message, tc.code)
			}
			if tc.warning != "" && (len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], tc.warning)) {
				t.Errorf("warnings = %q, want one with %q", got.Warnings, tc.warning)
			}
		})
	}
}

func TestServeMutatePatch(t *testing.T) {
	srv := NewServer(testRuntime(t, testScript), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ts := httptest.NewServer(srv)
	defer ts.Close()
	obj := widget(`{"size":3,"obsolete":true,"big":12345678901234567}`)
	got := post(t, ts.URL, "/mutate/defaults", request("CREATE", obj))
	if !got.Allowed || got.PatchType == nil || *got.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("got %+v, want allowed with a JSON patch", got)
	}
	var ops []map[string]any
	if err := json.Unmarshal(got.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"op": "add", "path": "/metadata/labels", "value": map[string]any{"example.com/mutated": "yes"}},
		{"op": "add", "path": "/spec/color", "value": "blue"},
		{"op": "remove", "path": "/spec/obsolete"},
	}
	if !reflect.DeepEqual(ops, want) {
		t.Errorf("patch = %s\nwant %v", got.Patch, want)
	}
	// What the API server does with it.
	p, err := jsonpatch.DecodePatch(got.Patch)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(obj)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"big":12345678901234567`) || !strings.Contains(string(out), `"color":"blue"`) {
		t.Errorf("patched object %s: large integers must survive, color must be set", out)
	}
	// Nothing to change: no patch at all.
	got = post(t, ts.URL, "/mutate/defaults", request("UPDATE", []byte(`{"metadata":{"name":"w1","labels":{"example.com/mutated":"yes"}},"spec":{"color":"red"}}`)))
	if !got.Allowed || got.Patch != nil {
		t.Errorf("got %+v, want allowed with no patch", got)
	}
}

func TestServeTimeout(t *testing.T) {
	srv := NewServer(testRuntime(t, testScript), slog.New(slog.NewTextHandler(io.Discard, nil)))
	// A Go handler that ignores its context: the answer must not wait for it.
	release := make(chan struct{})
	defer close(release)
	if err := srv.Register(Handler{ID: "stuck", Kind: causes.KindValidate, Timeout: time.Second, FailurePolicy: "Ignore",
		Admit: func(ctx context.Context, _ Request) (Response, error) {
			<-release
			return Response{Allowed: false}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	for _, tc := range []struct {
		path    string
		allowed bool
	}{{"/validate/spin", false}, {"/validate/stuck", true}} {
		got := post(t, ts.URL, tc.path, request("CREATE", widget(`{}`)))
		if got.Allowed != tc.allowed {
			t.Errorf("%s: got %+v %+v, want allowed=%v per its failure policy", tc.path, got, got.Result, tc.allowed)
		}
		msg := strings.Join(got.Warnings, " ")
		if got.Result != nil {
			msg = got.Result.Message
		}
		// Neither handler answers on its own (one spins, one ignores its context):
		// the answer came from the server's deadline, which it names. That deadline
		// is 4/5 of the webhook's 1s timeout, so the API server gets the answer
		// before it gives up; no time is measured here.
		if !strings.Contains(msg, "no answer within 800ms (the webhook's timeout is 1s)") {
			t.Errorf("%s: message %q should name the deadline kept (800ms, before the webhook's 1s timeout)", tc.path, msg)
		}
	}
}

func TestServeGoHandler(t *testing.T) {
	srv := NewServer(nil, nil)
	var seen Request
	if err := srv.Register(Handler{ID: "scripts", Kind: causes.KindValidate,
		Admit: func(_ context.Context, req Request) (Response, error) {
			seen = req
			return Response{Allowed: false, Message: "bad script", Code: 400, Warnings: []string{"w"}}, nil
		}}); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	got := post(t, ts.URL, "/validate/scripts", request("CREATE", []byte(`{"kind":"ConfigMap","metadata":{"name":"s"},"data":{"n":1}}`)))
	if got.Allowed || got.Result.Message != "bad script" || got.Result.Code != 400 || !reflect.DeepEqual(got.Warnings, []string{"w"}) {
		t.Errorf("got %+v %+v", got, got.Result)
	}
	if seen.Operation != "CREATE" || seen.UserInfo["username"] != "alice" || seen.Object["data"].(map[string]any)["n"] != int64(1) {
		t.Errorf("request seen by the handler: %+v", seen)
	}
	if hs := srv.Handlers(); len(hs) != 1 || hs[0].Path() != "/validate/scripts" {
		t.Errorf("Handlers() = %+v", hs)
	}
}

func TestServeBadRequests(t *testing.T) {
	ts := httptest.NewServer(NewServer(nil, nil))
	defer ts.Close()
	resp, err := http.Get(ts.URL + "/validate/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", resp.StatusCode)
	}
	resp, err = http.Post(ts.URL+"/validate/x", "application/json", strings.NewReader(`{"kind":"AdmissionReview"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("review without request: %d", resp.StatusCode)
	}
}

func TestJSONPatchEscapes(t *testing.T) {
	ops, err := jsonPatch([]byte(`{"metadata":{"annotations":{"a/b":"1","c~d":"2"}},"list":[1,2]}`),
		map[string]any{"metadata": map[string]any{"annotations": map[string]any{"a/b": "3", "c~d": nil}}, "list": []any{int64(3)}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(ops)
	want := `[{"op":"replace","path":"/list","value":[3]},{"op":"replace","path":"/metadata/annotations/a~1b","value":"3"},{"op":"remove","path":"/metadata/annotations/c~0d"}]`
	if string(raw) != want {
		t.Errorf("ops = %s\nwant  %s", raw, want)
	}
}

// Static label filters become the webhook's objectSelector (kopf's): the API server
// then calls the webhook only for objects they may match.
func TestLuaHandlersObjectSelector(t *testing.T) {
	rt := testRuntime(t, `
local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx) end,
  {id = "v", labels = {tier = "web", managed = luaop.PRESENT, skip = luaop.ABSENT, dyn = function(v) return true end}})
luaop.on.mutate("example.com/v1/widgets", function(ctx) end, {id = "m"})
`)
	hs := NewServer(rt, nil).Handlers()
	if len(hs) != 2 || hs[0].ID != "v" || hs[1].ID != "m" || hs[1].ObjectSelector != nil {
		t.Fatalf("handlers %+v", hs)
	}
	got := fmt.Sprint(hs[0].ObjectSelector.MatchExpressions)
	want := "[{managed Exists []} {skip DoesNotExist []} {tier In [web]}]"
	if got != want {
		t.Errorf("objectSelector %s, want %s", got, want)
	}
}
