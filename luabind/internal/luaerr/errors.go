package luaerr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	lua "github.com/luaop/luaop/third_party/gopher-lua"

	"github.com/luaop/luaop/luabind/internal/luavalue"
	"github.com/luaop/luaop/processing/causes"
)

// ScriptError is a failure of Lua code (a raised error, a runtime error, a timeout)
// that is neither luaop.temporary_error nor luaop.permanent_error. Error() gives
// "file.lua:12: message"; the traceback is kept apart, for logs.
type ScriptError struct {
	File      string
	Line      int
	Message   string
	Traceback string

	// cause is what errors.Is/As see through Unwrap: context.DeadlineExceeded or
	// context.Canceled for timeouts, the Go error raised by Throw.
	cause error
}

func (e *ScriptError) Error() string {
	switch {
	case e.File == "":
		return e.Message
	case e.Line <= 0:
		return e.File + ": " + e.Message
	default:
		return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Message
	}
}

func (e *ScriptError) Unwrap() error { return e.cause }

// WithCause sets what errors.Is/As see through se's Unwrap and returns se.
func WithCause(se *ScriptError, cause error) *ScriptError {
	se.cause = cause
	return se
}

// AdmissionError rejects an admission request with a message and an HTTP code
// (luaop.admission_error; kopf's AdmissionError).
type AdmissionError struct {
	Message string
	Code    int
}

func (e *AdmissionError) Error() string { return e.Message }

// Messages of timeouts and cancellations.
const (
	timeoutMessage  = "timed out after the handler deadline"
	canceledMessage = "cancelled before the handler finished"
	defaultDelay    = 60 * time.Second
)

// raised is the Go value of a raisable error userdata: luaop.temporary_error,
// luaop.permanent_error, or a Go error raised by Throw.
type raised struct {
	err error
}

var (
	locationRE  = regexp.MustCompile(`(?s)^(.*?):(\d+):\s?(.*)$`)
	syntaxRE    = regexp.MustCompile(`(?s)^(.*?) line:(\d+)\(column:\d+\) near '(.*?)':\s*(.*?)\s*$`)
	syntaxEOFRE = regexp.MustCompile(`(?s)^(.*?) at EOF:\s*(.*?)\s*$`)
	traceLineRE = regexp.MustCompile(`^\t(.+?):(\d+):`)
)

// Translate maps an error returned by L.PCall / L.CallByParam (a *lua.ApiError, possibly
// wrapped) into the framework's errors:
//   - error(luaop.temporary_error(msg, delay)) -> *causes.TemporaryError
//   - error(luaop.permanent_error(msg))        -> *causes.PermanentError
//   - a Go error raised with Throw             -> that error (TemporaryError,
//     PermanentError and AdmissionError as they are, others wrapped in a
//     *ScriptError)
//   - the handler deadline (L.SetContext)      -> *ScriptError "timed out after the
//     handler deadline", errors.Is(err, context.DeadlineExceeded) is true
//     (context.Canceled likewise)
//   - anything else                            -> *ScriptError with file and line
//
// Errors that are not *lua.ApiError are returned unchanged; nil stays nil.
func Translate(err error) error {
	if err == nil {
		return nil
	}
	var ae *lua.ApiError
	if !errors.As(err, &ae) {
		return err
	}
	se := &ScriptError{Traceback: ae.StackTrace}
	switch obj := ae.Object.(type) {
	case *lua.LUserData:
		if r, ok := obj.Value.(*raised); ok {
			var te *causes.TemporaryError
			var pe *causes.PermanentError
			var ae *AdmissionError
			switch {
			case errors.As(r.err, &ae):
				return &AdmissionError{Message: ae.Message, Code: ae.Code}
			case errors.As(r.err, &te):
				return &causes.TemporaryError{Message: te.Message, Delay: te.Delay}
			case errors.As(r.err, &pe):
				return &causes.PermanentError{Message: pe.Message}
			}
			se.Message = r.err.Error()
			se.cause = r.err
			break
		}
		if luavalue.IsNull(obj) {
			se.Message = "error(luaop.null) raised"
			break
		}
		se.Message = "error object is a userdata value"
	case lua.LString:
		full := string(obj)
		msg := luavalue.Cut(full, MaxMessage)
		if ae.Type == lua.ApiErrorSyntax {
			if m := syntaxRE.FindStringSubmatch(msg); m != nil {
				se.File, se.Message = m[1], fmt.Sprintf("syntax error near '%s': %s", m[3], m[4])
				se.Line, _ = strconv.Atoi(m[2])
				break
			}
			if m := syntaxEOFRE.FindStringSubmatch(msg); m != nil {
				se.File, se.Message = m[1], "syntax error at end of file: "+m[2]
				break
			}
		}
		if ae.Type == lua.ApiErrorPanic {
			// The patched VM locates a Go panic at the Lua line that called the
			// function (third_party/gopher-lua: goPanicMessage).
			if m := locationRE.FindStringSubmatch(msg); m != nil && !strings.ContainsAny(m[1], " \t\n") {
				se.File, msg = m[1], m[3]
				se.Line, _ = strconv.Atoi(m[2])
			}
			se.Message = "panic in a Go function: " + strings.TrimSpace(msg)
			if strings.Contains(msg, "lua callstack overflow") {
				// gopher-lua's growing call stack panics where its fixed one
				// raises: the same limit, said the same way.
				se.Message = "stack overflow"
			}
			break
		}
		se.Message = strings.TrimSpace(msg)
		if m := locationRE.FindStringSubmatch(msg); m != nil && !strings.ContainsAny(m[1], " \t\n") {
			se.File, se.Message = m[1], strings.TrimSpace(m[3])
			se.Line, _ = strconv.Atoi(m[2])
		}
		// The VM raises ctx.Err().Error() at the instruction it was running.
		switch {
		case strings.HasSuffix(full, context.DeadlineExceeded.Error()):
			se.Message, se.cause = timeoutMessage, context.DeadlineExceeded
		case strings.HasSuffix(full, context.Canceled.Error()):
			se.Message, se.cause = canceledMessage, context.Canceled
		}
	case *lua.LNilType:
		se.Message = "error(nil) raised"
	case *lua.LTable:
		se.Message = renderTable(obj)
	case lua.LNumber, lua.LBool:
		se.Message = obj.String()
	default:
		se.Message = "error object is a " + ae.Object.Type().String() + " value"
	}
	if se.File == "" || IsInternalChunk(se.File) {
		se.File, se.Line = traceLocation(ae.StackTrace)
	}
	return se
}

// ScriptWhere is "file:line:" of the innermost frame that is a script's (not a Go
// function's, nor one of luaop's internal chunks), or "" when there is none: where
// a Go function of luaop reports a bad argument, even when pcall or an internal
// chunk called it (pcall(luaop.sleep, {}) names the pcall's line).
func ScriptWhere(L *lua.LState) string {
	for level := 0; level < 256; level++ {
		dbg, ok := L.GetStack(level)
		if !ok {
			return ""
		}
		if _, err := L.GetInfo("Sl", dbg, lua.LNil); err != nil {
			return ""
		}
		if dbg.What == "G" || dbg.CurrentLine <= 0 || IsInternalChunk(dbg.Source) {
			continue
		}
		return dbg.Source + ":" + strconv.Itoa(dbg.CurrentLine) + ":"
	}
	return ""
}

// RaiseAtScript raises the message at ScriptWhere (L.RaiseError would name the
// innermost Lua frame, which may be an internal chunk of luaop).
func RaiseAtScript(L *lua.LState, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if where := ScriptWhere(L); where != "" {
		msg = where + " " + msg
	}
	L.Error(lua.LString(msg), 0)
}

// InternalChunk names a chunk of luaop's own Lua that runs between a script and a Go
// function (luaop.sleep's wrapper, a daemon's entry): "<luaop." + name + ">". An
// error located there is reported at the script's frame that called it.
func InternalChunk(name string) string { return "<luaop." + name + ">" }

// IsInternalChunk tells whether file names a chunk made by InternalChunk.
func IsInternalChunk(file string) bool { return strings.HasPrefix(file, "<luaop.") }

// traceLocation returns the innermost Lua frame of a gopher-lua traceback that is a
// script's (not a Go function's, nor one of luaop's internal chunks).
func traceLocation(trace string) (string, int) {
	for _, line := range strings.Split(trace, "\n") {
		if m := traceLineRE.FindStringSubmatch(line); m != nil && !strings.HasPrefix(m[1], "[G]") && !IsInternalChunk(m[1]) {
			n, _ := strconv.Atoi(m[2])
			return m[1], n
		}
	}
	return "", 0
}

// renderTable renders error({...}): its message field when there is one, else a
// compact Lua-like dump with sorted keys (luavalue.Describe: nothing larger than
// the dump's 1,000 bytes is built, whatever the table holds).
func renderTable(t *lua.LTable) string {
	if _, ok := luavalue.ProxyValue(t); !ok {
		if m := t.RawGetString("message"); m != lua.LNil {
			if s, ok := m.(lua.LString); ok {
				return luavalue.Cut(string(s), MaxMessage)
			}
			if lua.LVCanConvToString(m) {
				return m.String()
			}
		}
	}
	return luavalue.Describe(t, 1000)
}

// MaxMessage bounds the message of an error (and of an admission response, an
// Event's text), in bytes: a script's 16 MiB error string is cut there with "…",
// not copied into every log line, Event and status that names the error.
const MaxMessage = 16 << 10

// MessageArg is argument n as a message (luaop.permanent_error's, luaop.exception's
// error): tostring of it, cut at MaxMessage.
func MessageArg(L *lua.LState, n int) string {
	s, err := luavalue.ToString(L, L.Get(n))
	if err != nil {
		L.ArgError(n, err.Error())
	}
	return luavalue.Cut(s, MaxMessage)
}

// Throw raises err from a Go function called by Lua, as a value Translate turns
// back into err (a *causes.TemporaryError stays one, other errors come back wrapped in
// a *ScriptError whose Unwrap gives err). In Lua, pcall sees a userdata whose tostring
// is err.Error() and whose .message is the same. It does not return.
func Throw(L *lua.LState, err error) {
	L.Error(NewRaised(L, err), 1)
}

// NewRaised returns the Lua value of err that Throw raises, for a function that
// returns it instead (luaop.temporary_error, luaop.admission_error).
func NewRaised(L *lua.LState, err error) *lua.LUserData {
	return &lua.LUserData{Value: &raised{err: err}, Metatable: metatable(L)}
}

// registryKey is where a state's registry keeps the metatable of raised errors.
const registryKey = "luaop.luaerr.metatable"

// metatable returns the state's metatable of raised errors, making it on first use.
// It lives in the state's registry, which coroutines (NewThread) share.
func metatable(L *lua.LState) *lua.LTable {
	if mt, ok := L.G.Registry.RawGetString(registryKey).(*lua.LTable); ok {
		return mt
	}
	mt := newErrorMetatable(L)
	L.G.Registry.RawSetString(registryKey, mt)
	return mt
}

func newErrorMetatable(L *lua.LState) *lua.LTable {
	errMT := L.CreateTable(0, 3)
	errMT.RawSetString("__tostring", L.NewFunction(func(L *lua.LState) int {
		r := raisedArg(L)
		L.Push(lua.LString(r.err.Error()))
		return 1
	}))
	errMT.RawSetString("__index", L.NewFunction(func(L *lua.LState) int {
		r := raisedArg(L)
		var te *causes.TemporaryError
		var pe *causes.PermanentError
		isTemp := errors.As(r.err, &te)
		isPerm := !isTemp && errors.As(r.err, &pe)
		switch L.CheckString(2) {
		case "message":
			switch {
			case isTemp:
				L.Push(lua.LString(te.Message))
			case isPerm:
				L.Push(lua.LString(pe.Message))
			default:
				L.Push(lua.LString(r.err.Error()))
			}
		case "delay":
			if isTemp {
				L.Push(lua.LNumber(te.Delay.Seconds()))
			} else {
				L.Push(lua.LNil)
			}
		case "code":
			var ae *AdmissionError
			if errors.As(r.err, &ae) {
				L.Push(lua.LNumber(ae.Code))
			} else {
				L.Push(lua.LNil)
			}
		case "kind":
			var ae *AdmissionError
			switch {
			case errors.As(r.err, &ae):
				L.Push(lua.LString("admission"))
			case isTemp:
				L.Push(lua.LString("temporary"))
			case isPerm:
				L.Push(lua.LString("permanent"))
			default:
				L.Push(lua.LString("error"))
			}
		default:
			L.Push(lua.LNil)
		}
		return 1
	}))
	errMT.RawSetString("__metatable", lua.LString("luaop.error"))
	return errMT
}

func raisedArg(L *lua.LState) *raised {
	if ud, ok := L.Get(1).(*lua.LUserData); ok {
		if r, ok := ud.Value.(*raised); ok {
			return r
		}
	}
	L.ArgError(1, "luaop error expected")
	return nil
}

// InstallConstructors defines, on the luaop module table:
//
//	mod.temporary_error(message, delay_seconds?)  retry after the delay (default 60)
//	mod.permanent_error(message)                  fail for good
//
// Both return an error value for error(...): error(luaop.temporary_error("x", 5)) makes
// Translate return &causes.TemporaryError{Message: "x", Delay: 5 * time.Second}. The
// value has e.message, e.delay (seconds, temporary only) and e.kind ("temporary",
// "permanent"), and tostring(e) describes it, for handlers that pcall.
func InstallConstructors(L *lua.LState, mod *lua.LTable) {
	message := func(L *lua.LState) string {
		if L.Get(1) == lua.LNil {
			L.ArgError(1, "message expected")
		}
		return MessageArg(L, 1)
	}
	mod.RawSetString("temporary_error", L.NewFunction(func(L *lua.LState) int {
		msg := message(L)
		delay := defaultDelay
		if v := L.Get(2); v != lua.LNil {
			n, ok := v.(lua.LNumber)
			if !ok {
				L.ArgError(2, "delay in seconds expected, got "+v.Type().String())
			}
			f := float64(n)
			if math.IsNaN(f) || f < 0 || f > float64(math.MaxInt64)/float64(time.Second) {
				L.ArgError(2, "delay must be a non-negative number of seconds")
			}
			delay = time.Duration(f * float64(time.Second))
		}
		L.Push(NewRaised(L, &causes.TemporaryError{Message: msg, Delay: delay}))
		return 1
	}))
	mod.RawSetString("permanent_error", L.NewFunction(func(L *lua.LState) int {
		L.Push(NewRaised(L, &causes.PermanentError{Message: message(L)}))
		return 1
	}))
}
