// Package luaerr carries errors across the Lua boundary. Going up, Translate turns
// what gopher-lua returns from a call (a raised value, a runtime or syntax error, a
// timeout) into the framework's errors: *ScriptError with file and line, or the
// causes.TemporaryError, causes.PermanentError or AdmissionError a script raised.
// Going down, Throw raises a Go error from a Go function so that Translate gives it
// back, and InstallConstructors gives scripts luaop.temporary_error and
// luaop.permanent_error.
//
// Its one per-state object, the metatable of raised errors, lives in the LState's
// registry, made on first use; it belongs to whoever holds the state (in luabind, the
// shard's lock).
package luaerr
