package luabind

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

const admScript = `
local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx)
  if ctx.spec.size == nil then
    return false, "spec.size is required (" .. ctx.operation .. ")"
  end
  if ctx.spec.size > 10 then
    error(luaop.admission_error("spec.size must be at most 10", 422))
  end
  if ctx.spec.size == 7 then
    table.insert(ctx.warnings, "7 is unlucky")
  end
  if ctx.spec.size == 9 then
    error("boom")
  end
  if ctx.dryrun then
    table.insert(ctx.warnings, "dry run by " .. ctx.userinfo.username)
  end
  if ctx.old then
    table.insert(ctx.warnings, "was " .. tostring(ctx.old.spec.size))
  end
end, {id = "size", operations = {"CREATE", "UPDATE"}, failure_policy = "Ignore", timeout = 5,
      labels = {skip = luaop.ABSENT}})

luaop.on.mutate("example.com/v1/widgets", function(ctx)
  if ctx.spec.color == nil then ctx.patch.spec.color = "blue" end
  ctx.patch.metadata.labels.mutated = "yes"
  if ctx.labels.drop then ctx.patch.metadata.labels.drop = luaop.null end
end, {id = "defaults", when = function(ctx) return ctx.operation ~= "CONNECT" end})
`

func admObject(spec map[string]any, labels map[string]any) map[string]any {
	meta := map[string]any{"name": "w1", "namespace": "default"}
	if labels != nil {
		meta["labels"] = labels
	}
	return map[string]any{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": meta, "spec": spec}
}

func admHandler(t *testing.T, rt *Runtime, id string) causes.Spec {
	t.Helper()
	for _, h := range rt.AdmissionHandlers() {
		if h.ID == id {
			return h
		}
	}
	t.Fatalf("no admission handler %q", id)
	return causes.Spec{}
}

func TestAdmissionRegistration(t *testing.T) {
	rt := newTestRuntime(t, Options{})
	rep := mustLoad(t, rt, "widgets.lua", admScript)
	if len(rt.Specs()) != 0 {
		t.Fatalf("admission handlers must not be watched by the core: Specs() = %v", specIDs(rt.Specs()))
	}
	size := admHandler(t, rt, "size")
	if size.Kind != causes.KindValidate || !reflect.DeepEqual(size.Operations, []string{"CREATE", "UPDATE"}) ||
		size.FailurePolicy != "Ignore" || size.Timeout != 5*time.Second || size.Source != "widgets.lua:3" {
		t.Errorf("size spec = %+v", size)
	}
	if d := admHandler(t, rt, "defaults"); d.Kind != causes.KindMutate || d.CodeHash == "" {
		t.Errorf("defaults spec = %+v", d)
	}
	if len(rep.Handlers) != 2 {
		t.Errorf("LoadReport.Handlers = %v, want both admission handlers", specIDs(rep.Handlers))
	}
}

func TestAdmissionRegistrationErrors(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{`require("luaop").on.validate("example.com/v1/widgets", function() end, {timeout = 45})`, "1 to 30 seconds"},
		{`require("luaop").on.validate("example.com/v1/widgets", function() end, {failure_policy = "fail"})`, `use "Fail"`},
		{`require("luaop").on.mutate("example.com/v1/widgets", function() end, {operations = "PATCH"})`, "option operations"},
		{`require("luaop").on.create("example.com/v1/widgets", function() end, {failure_policy = "Fail"})`, "admission handlers only"},
		{`require("luaop").on.validate("example.com/v1/widgets", function() end, {labels = {tier = "front end"}})`, `labels filter "tier" = "front end" cannot be the webhook's objectSelector`},
		{`require("luaop").on.validate("example.com/v1/widgets", function() end, {labels = {["bad key!"] = require("luaop").PRESENT}})`, `labels filter "bad key!"`},
	} {
		rt := newTestRuntime(t, Options{})
		_, err := rt.Load(t.Context(), scriptsOf("a.lua", tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "a.lua:1") {
			t.Errorf("%s: err = %v, want a.lua:1 and %q", tc.src, err, tc.want)
		}
	}
}

func TestAdmit(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "widgets.lua", admScript)
	size := admHandler(t, rt, "size")
	for _, tc := range []struct {
		name string
		req  AdmissionRequest
		want AdmissionResponse
		err  string
	}{
		{name: "allowed", req: AdmissionRequest{Operation: "CREATE", Object: admObject(map[string]any{"size": int64(3)}, nil)},
			want: AdmissionResponse{Allowed: true}},
		{name: "return false", req: AdmissionRequest{Operation: "CREATE", Object: admObject(map[string]any{}, nil)},
			want: AdmissionResponse{Allowed: false, Message: "spec.size is required (CREATE)"}},
		{name: "admission_error", req: AdmissionRequest{Operation: "CREATE", Object: admObject(map[string]any{"size": int64(11)}, nil)},
			want: AdmissionResponse{Allowed: false, Message: "spec.size must be at most 10", Code: 422}},
		{name: "warnings", req: AdmissionRequest{Operation: "CREATE", Object: admObject(map[string]any{"size": int64(7)}, nil)},
			want: AdmissionResponse{Allowed: true, Warnings: []string{"7 is unlucky"}}},
		{name: "dry run and user", req: AdmissionRequest{Operation: "CREATE", DryRun: true, UserInfo: map[string]any{"username": "alice"},
			Object: admObject(map[string]any{"size": int64(1)}, nil)},
			want: AdmissionResponse{Allowed: true, Warnings: []string{"dry run by alice"}}},
		{name: "update sees old", req: AdmissionRequest{Operation: "UPDATE", Object: admObject(map[string]any{"size": int64(2)}, nil),
			OldObject: admObject(map[string]any{"size": int64(1)}, nil)},
			want: AdmissionResponse{Allowed: true, Warnings: []string{"was 1"}}},
		{name: "filtered out", req: AdmissionRequest{Operation: "CREATE", Object: admObject(map[string]any{}, map[string]any{"skip": "1"})},
			want: AdmissionResponse{Skipped: true, Allowed: true}},
		{name: "error", req: AdmissionRequest{Operation: "CREATE", Object: admObject(map[string]any{"size": int64(9)}, nil)},
			err: "widgets.lua:14: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Handler = size
			got, err := rt.Admit(t.Context(), tc.req)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAdmitMutatePatch(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "widgets.lua", admScript)
	d := admHandler(t, rt, "defaults")
	got, err := rt.Admit(t.Context(), AdmissionRequest{Handler: d, Operation: "CREATE",
		Object: admObject(map[string]any{"size": int64(1)}, map[string]any{"drop": "x"})})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"spec": map[string]any{"color": "blue"}, "metadata": map[string]any{"labels": map[string]any{"mutated": "yes", "drop": nil}}}
	if !got.Allowed || !reflect.DeepEqual(got.Patch, want) {
		t.Errorf("got %+v, want patch %v", got, want)
	}
	// The when filter sees ctx.operation.
	got, err = rt.Admit(t.Context(), AdmissionRequest{Handler: d, Operation: "CONNECT",
		Object: admObject(map[string]any{"size": int64(1)}, nil)})
	if err != nil || !got.Skipped {
		t.Errorf("CONNECT: got %+v, %v; want skipped by the when filter", got, err)
	}
}

func TestAdmitDeadline(t *testing.T) {
	rt := loadedRuntime(t, Options{HandlerTimeout: time.Minute}, "slow.lua", `
local luaop = require("luaop")
luaop.on.validate("example.com/v1/widgets", function(ctx) while true do end end, {id = "spin"})
luaop.on.validate("example.com/v1/widgets", function(ctx) luaop.sleep(60) return false, "slept" end, {id = "sleep"})
`)
	for _, id := range []string{"spin", "sleep"} {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		got, err := rt.Admit(ctx, AdmissionRequest{Handler: admHandler(t, rt, id), Operation: "CREATE", Object: admObject(nil, nil)})
		cancel()
		if id == "spin" && (err == nil || !errors.Is(err, context.DeadlineExceeded)) {
			t.Errorf("%s: got %+v, %v; want the deadline's error", id, got, err)
		}
		if id == "sleep" && (err != nil || got.Allowed || got.Message != "slept") {
			// luaop.sleep returns false at the deadline; the handler then answers.
			if err == nil || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: got %+v, %v", id, got, err)
			}
		}
	}
}

func TestAdmitReloadRemovedHandler(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "widgets.lua", admScript)
	size := admHandler(t, rt, "size")
	mustLoad(t, rt, "other.lua", `require("luaop").on.create("example.com/v1/widgets", function() end)`)
	if _, err := rt.Admit(t.Context(), AdmissionRequest{Handler: size, Operation: "CREATE", Object: admObject(nil, nil)}); err == nil ||
		!strings.Contains(err.Error(), "no longer registered") {
		t.Errorf("err = %v, want the handler reported as removed", err)
	}
}

// kopf skips mutating handlers on a DELETE unless their operations are exactly
// DELETE (WebhooksRegistry.iter_handlers): the request is allowed untouched, the
// handler does not run. Validating handlers run on deletions as on anything else.
func TestMutatingHandlersSkipDeletionsUnlessOnlyForThem(t *testing.T) {
	rt := loadedRuntime(t, Options{}, "widgets.lua", `
local luaop = require("luaop")
local function mark(ctx) ctx.patch.metadata.labels.seen = ctx.operation; table.insert(ctx.warnings, "ran") end
luaop.on.mutate("example.com/v1/widgets", mark, {id = "all"})
luaop.on.mutate("example.com/v1/widgets", mark, {id = "create-and-delete", operations = {"CREATE", "DELETE"}})
luaop.on.mutate("example.com/v1/widgets", mark, {id = "delete-only", operations = "DELETE"})
luaop.on.validate("example.com/v1/widgets", function(ctx) table.insert(ctx.warnings, "validated") end, {id = "check"})
`)
	old := admObject(map[string]any{"size": int64(1)}, nil)
	for _, tc := range []struct {
		id, operation string
		ran           bool
	}{
		{"all", "DELETE", false},
		{"create-and-delete", "DELETE", false},
		{"delete-only", "DELETE", true},
		{"all", "CREATE", true},
		{"create-and-delete", "CREATE", true},
		{"check", "DELETE", true},
	} {
		req := AdmissionRequest{Handler: admHandler(t, rt, tc.id), Operation: tc.operation, OldObject: old}
		if tc.operation != "DELETE" {
			req.Object, req.OldObject = old, nil
		}
		got, err := rt.Admit(t.Context(), req)
		if err != nil {
			t.Fatalf("%s on %s: %v", tc.id, tc.operation, err)
		}
		if ran := len(got.Warnings) > 0; ran != tc.ran || got.Skipped == tc.ran || !got.Allowed {
			t.Errorf("%s on %s: %+v; want ran=%v (and allowed)", tc.id, tc.operation, got, tc.ran)
		}
	}
}
