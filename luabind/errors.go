package luabind

import "github.com/luaop/luaop/luabind/internal/luaerr"

// ScriptError is a failure of Lua code (a raised error, a runtime error, a timeout)
// that is neither luaop.temporary_error nor luaop.permanent_error. Error() gives
// "file.lua:12: message"; the traceback is kept apart, for logs. errors.Is and
// errors.As see its cause: context.DeadlineExceeded for a handler timeout,
// ErrMemoryBudget, or the Go error a luaop function raised.
type ScriptError = luaerr.ScriptError
