package luaerr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luatest"
	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/luabind/internal/sandbox"
	"github.com/luaop/luaop/processing/causes"
)

// newTestState returns a sandboxed state with a global `luaop` holding the markers and the
// error constructors.
func newTestState(t testing.TB) *lua.LState {
	t.Helper()
	L := sandbox.NewState(sandbox.Options{})
	t.Cleanup(L.Close)
	mod := L.NewTable()
	luavalue.InstallMarkers(L, mod)
	InstallConstructors(L, mod)
	L.SetGlobal("luaop", mod)
	return L
}

// newErrorState is newTestState plus Go functions that fail in various ways.
func newErrorState(t testing.TB) *lua.LState {
	L := newTestState(t)
	L.SetGlobal("goraise", L.NewFunction(func(L *lua.LState) int {
		L.RaiseError("boom %d", 1)
		return 0
	}))
	L.SetGlobal("goarg", L.NewFunction(func(L *lua.LState) int {
		L.CheckTable(1)
		return 0
	}))
	L.SetGlobal("gopanic", L.NewFunction(func(L *lua.LState) int {
		var m map[string]int
		//lint:ignore SA5000 the point: a Go panic inside a Go function called from Lua
		m["x"] = 1
		return 0
	}))
	L.SetGlobal("goyield", L.NewFunction(func(L *lua.LState) int {
		return L.Yield(lua.LNumber(1))
	}))
	L.SetGlobal("gotemporary", L.NewFunction(func(L *lua.LState) int {
		Throw(L, &causes.TemporaryError{Message: "conflict", Delay: 2 * time.Second})
		return 0
	}))
	L.SetGlobal("gofail", L.NewFunction(func(L *lua.LState) int {
		Throw(L, fmt.Errorf("patching: %w", io.ErrUnexpectedEOF))
		return 0
	}))
	return L
}

func TestLuaErrorScriptErrors(t *testing.T) {
	cases := []struct {
		name    string
		lua     string
		file    string
		line    int
		message string
		text    string // Error(), when checked
	}{
		{name: "error string", lua: "local x = 1\n\nerror('text')", file: "handler.lua", line: 3, message: "text", text: "handler.lua:3: text"},
		{name: "error string level 0", lua: "local x = 1\nerror('bare', 0)", file: "handler.lua", line: 2, message: "bare"},
		// gopher-lua quirk: level 2 names the function calling error, like level 1
		// (Lua 5.1 would name its caller, line 4).
		{name: "error string level 2", lua: "local function check(v)\n  error('bad value', 2)\nend\ncheck(1)", file: "handler.lua", line: 2, message: "bad value"},
		{name: "error with colons", lua: "error('a: b: c:1: d')", file: "handler.lua", line: 1, message: "a: b: c:1: d"},
		{name: "colon in a sentence", lua: "error('see http://host:80: down', 0)", file: "handler.lua", line: 1, message: "see http://host:80: down"},
		{name: "multi-line message", lua: "error('first\\nsecond')", file: "handler.lua", line: 1, message: "first\nsecond"},
		{name: "error table with message", lua: "\nerror({message = 'table message', code = 3})", file: "handler.lua", line: 2, message: "table message"},
		{name: "error table without message", lua: "error({code = 3, reason = 'x', list = {1, 2}, ['a-b'] = true})", file: "handler.lua", line: 1, message: `{["a-b"] = true, code = 3, list = {[1] = 1, [2] = 2}, reason = "x"}`},
		{name: "error table nested", lua: "error({a = {b = {c = {d = {}}}}})", file: "handler.lua", line: 1, message: `{a = {b = {c = {…}}}}`},
		{name: "error nil", lua: "local x\n\nerror(nil)", file: "handler.lua", line: 3, message: "error(nil) raised", text: "handler.lua:3: error(nil) raised"},
		{name: "error number", lua: "error(42)", file: "handler.lua", line: 1, message: "42"},
		{name: "error boolean", lua: "error(false)", file: "handler.lua", line: 1, message: "false"},
		{name: "error function", lua: "error(print)", file: "handler.lua", line: 1, message: "error object is a function value"},
		{name: "error null", lua: "error(luaop.null)", file: "handler.lua", line: 1, message: "error(luaop.null) raised"},
		{name: "Go RaiseError", lua: "\ngoraise()", file: "handler.lua", line: 2, message: "boom 1"},
		{name: "Go ArgError", lua: "goarg(1)", file: "handler.lua", line: 1, message: "bad argument #1 to goarg (table expected, got number)"},
		{name: "Go panic", lua: "\n\ngopanic()", file: "handler.lua", line: 3, message: "panic in a Go function: gopanic: assignment to entry in nil map"},
		{name: "Go error", lua: "gofail()", file: "handler.lua", line: 1, message: "patching: unexpected EOF"},
		{name: "yield outside a coroutine", lua: "\ngoyield()", file: "handler.lua", line: 2, message: "can not yield from outside of a coroutine"},
		{name: "stack overflow", lua: "local function f()\n  return 1 + f()\nend\nf()", file: "handler.lua", line: 2, message: "stack overflow"},
		{name: "index nil", lua: "local obj = {}\nreturn obj.spec.replicas", file: "handler.lua", line: 2, message: "attempt to index a non-table object(nil) with key 'replicas'"},
		{name: "call nil", lua: "local f\nf()", file: "handler.lua", line: 2, message: "attempt to call a non-function object"},
		{name: "arithmetic on nil", lua: "local x\nreturn x + 1", file: "handler.lua", line: 2, message: "cannot perform add operation between nil and number"},
		{name: "read-only proxy", lua: "local o = luaop_proxy\no.spec = 1", file: "handler.lua", line: 2, message: "spec is read-only: write to ctx.patch instead"},
		{name: "rethrown after pcall", lua: "local ok, e = pcall(error, 'inner')\nerror(e, 0)", file: "handler.lua", line: 1, message: "inner"},
		{name: "rethrown without location", lua: "local ok, e = pcall(function() error('inner', 0) end)\nerror(e, 0)", file: "handler.lua", line: 2, message: "inner", text: "handler.lua:2: inner"},
		{name: "assert", lua: "\nassert(false, 'must hold')", file: "handler.lua", line: 2, message: "must hold"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newErrorState(t)
			L.SetGlobal("luaop_proxy", luavalue.NewProxy(L, map[string]any{"spec": map[string]any{}}))
			_, raw := luatest.Call(t, L, tc.lua)
			if raw == nil {
				t.Fatal("no error")
			}
			err := Translate(raw)
			var se *ScriptError
			if !errors.As(err, &se) {
				t.Fatalf("%T %v is not a ScriptError", err, err)
			}
			if se.File != tc.file || se.Line != tc.line || !strings.Contains(se.Message, tc.message) {
				t.Fatalf("got File=%q Line=%d Message=%q, want %q %d %q", se.File, se.Line, se.Message, tc.file, tc.line, tc.message)
			}
			if se.Traceback == "" || strings.Contains(se.Error(), "stack traceback") {
				t.Fatalf("traceback misplaced: %q / %q", se.Traceback, se.Error())
			}
			if tc.text != "" && se.Error() != tc.text {
				t.Fatalf("Error() = %q, want %q", se.Error(), tc.text)
			}
		})
	}
}

func TestLuaErrorCauses(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want error
	}{
		{"temporary", `error(luaop.temporary_error("x", 5))`, &causes.TemporaryError{Message: "x", Delay: 5 * time.Second}},
		{"temporary default delay", `error(luaop.temporary_error("later"))`, &causes.TemporaryError{Message: "later", Delay: 60 * time.Second}},
		{"temporary fractional delay", `error(luaop.temporary_error("soon", 0.5))`, &causes.TemporaryError{Message: "soon", Delay: 500 * time.Millisecond}},
		{"temporary zero delay", `error(luaop.temporary_error("now", 0))`, &causes.TemporaryError{Message: "now", Delay: 0}},
		{"permanent", `error(luaop.permanent_error("never"))`, &causes.PermanentError{Message: "never"}},
		{"permanent level 2", `error(luaop.permanent_error("never"), 2)`, &causes.PermanentError{Message: "never"}},
		{"number message", `error(luaop.permanent_error(42))`, &causes.PermanentError{Message: "42"}},
		{"rethrown after pcall", `
			local ok, e = pcall(function() error(luaop.temporary_error("x", 1)) end)
			assert(not ok and e.kind == "temporary" and e.message == "x" and e.delay == 1)
			assert(tostring(e) == "x (retry in 1s)", tostring(e))
			error(e)`, &causes.TemporaryError{Message: "x", Delay: time.Second}},
		{"permanent fields", `
			local e = luaop.permanent_error("p")
			assert(e.kind == "permanent" and e.message == "p" and e.delay == nil and tostring(e) == "p")
			error(e)`, &causes.PermanentError{Message: "p"}},
		{"from Go", `gotemporary()`, &causes.TemporaryError{Message: "conflict", Delay: 2 * time.Second}},
		{"from Go through pcall", `local ok, e = pcall(gotemporary); assert(e.kind == "temporary"); error(e)`, &causes.TemporaryError{Message: "conflict", Delay: 2 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newErrorState(t)
			_, raw := luatest.Call(t, L, tc.lua)
			if raw == nil {
				t.Fatal("no error")
			}
			err := Translate(raw)
			if fmt.Sprintf("%T %+v", err, err) != fmt.Sprintf("%T %+v", tc.want, tc.want) {
				t.Fatalf("got %T %+v, want %T %+v", err, err, tc.want, tc.want)
			}
		})
	}
}

func TestLuaErrorConstructorArguments(t *testing.T) {
	cases := []struct {
		name string
		lua  string
		want string
	}{
		{"no message", `luaop.temporary_error()`, "bad argument #1"},
		{"negative delay", `luaop.temporary_error("x", -1)`, "delay must be a non-negative number of seconds"},
		{"string delay", `luaop.temporary_error("x", "5")`, "delay in seconds expected, got string"},
		{"NaN delay", `luaop.temporary_error("x", 0/0)`, "delay must be a non-negative number of seconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newErrorState(t)
			_, err := luatest.Call(t, L, tc.lua)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestLuaErrorContext(t *testing.T) {
	cases := []struct {
		name    string
		lua     string
		timeout time.Duration
		cancel  bool
		is      error
		message string
	}{
		{"deadline", "local n = 0\nwhile true do n = n + 1 end", 30 * time.Millisecond, false, context.DeadlineExceeded, timeoutMessage},
		{"deadline caught by pcall", "while true do pcall(function() while true do end end) end", 30 * time.Millisecond, false, context.DeadlineExceeded, timeoutMessage},
		{"cancelled", "while true do end", 0, true, context.Canceled, canceledMessage},
		{"deadline in gsub", "local s = ('x'):rep(4000000)\nwhile true do s:gsub('x', 'x') end", 30 * time.Millisecond, false, context.DeadlineExceeded, timeoutMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newErrorState(t)
			var ctx context.Context
			var cancel context.CancelFunc
			if tc.cancel {
				ctx, cancel = context.WithCancel(t.Context())
				time.AfterFunc(20*time.Millisecond, cancel)
			} else {
				ctx, cancel = context.WithTimeout(t.Context(), tc.timeout)
			}
			defer cancel()
			L.SetContext(ctx)
			defer L.RemoveContext()
			_, raw := luatest.Call(t, L, tc.lua)
			err := Translate(raw)
			if !errors.Is(err, tc.is) {
				t.Fatalf("errors.Is(%v, %v) is false", err, tc.is)
			}
			var se *ScriptError
			if !errors.As(err, &se) || se.Message != tc.message || se.File != "handler.lua" || se.Line == 0 {
				t.Fatalf("got %#v", se)
			}
		})
	}
}

func TestLuaErrorPassThrough(t *testing.T) {
	if Translate(nil) != nil {
		t.Fatal("nil")
	}
	plain := errors.New("not a Lua error")
	if Translate(plain) != plain {
		t.Fatal("non-Lua errors must pass unchanged")
	}
	// Wrapped ApiError is found.
	L := newErrorState(t)
	_, raw := luatest.Call(t, L, "error('x')")
	var se *ScriptError
	if !errors.As(Translate(fmt.Errorf("calling handler: %w", raw)), &se) || se.Message != "x" {
		t.Fatal("wrapped ApiError")
	}
	// A Go error raised by Throw is reachable.
	_, raw = luatest.Call(t, L, "gofail()")
	if !errors.Is(Translate(raw), io.ErrUnexpectedEOF) {
		t.Fatal("Throw: cause lost")
	}
}

func TestLuaErrorSyntax(t *testing.T) {
	cases := []struct {
		name string
		code string
		line int
		msg  string
	}{
		{"near token", "local x = 1\nlocal = 2", 2, "syntax error near '='"},
		{"at EOF", "if true then", 0, "syntax error at end of file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			L := newTestState(t)
			_, err := L.Load(strings.NewReader(tc.code), "broken.lua")
			var se *ScriptError
			if !errors.As(Translate(err), &se) {
				t.Fatalf("%T %v", Translate(err), Translate(err))
			}
			if se.File != "broken.lua" || se.Line != tc.line || !strings.Contains(se.Message, tc.msg) {
				t.Fatalf("got %+v", se)
			}
		})
	}
}

func TestScriptErrorText(t *testing.T) {
	cases := []struct {
		err  ScriptError
		want string
	}{
		{ScriptError{File: "a.lua", Line: 12, Message: "m", Traceback: "stack traceback: ..."}, "a.lua:12: m"},
		{ScriptError{File: "a.lua", Message: "m"}, "a.lua: m"},
		{ScriptError{Message: "m"}, "m"},
	}
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Fatalf("got %q", got)
			}
		})
	}
}

// No Lua error may escape as a Go panic when called through PCall, and the state stays
// usable afterwards.
func TestLuaErrorsDoNotPanic(t *testing.T) {
	L := newErrorState(t)
	for _, code := range []string{
		"error('x')", "error(nil)", "error({})", "gopanic()", "goyield()", "local function f() f() end f()",
		"error(luaop.temporary_error('x'))", "local t = nil; t.x = 1", "string.rep('x', 1e12)", "return #nil",
	} {
		_, err := luatest.Call(t, L, code)
		if err == nil {
			t.Fatalf("%s: no error", code)
		}
		if Translate(err) == nil {
			t.Fatalf("%s: mapped to nil", code)
		}
	}
	if got := luatest.MustCall(t, L, "return 40 + 2"); got.String() != "42" {
		t.Fatal("state unusable")
	}
}
