// Package handling holds the rules of one handler run, the same for every engine
// that runs handlers (the processing core, the operator's hooks, `luaop test`):
//
//   - the cause a handler is given: a change handler's view of its cause (a field
//     handler's old, new and diff reduced to its field, the whole essences kept for
//     its subhandlers), the essence with the fields handlers name, the causes of
//     event handlers, timers, daemons and hooks (cause.go);
//   - the verdict on an attempt: how an error is classified (retry after a
//     TemporaryError's delay, backoff after an arbitrary one, permanent, ignored),
//     the one default backoff, the strict check before an attempt and kopf's
//     look-ahead after it (retries, timeout), with one message form (verdict.go);
//   - where a result goes: status.<handler id>, for every kind of handler whose
//     result kopf delivers (result.go);
//   - subhandlers: how deep they nest and how their filters see the parent's cause:
//     the whole object, a deliberate difference from kopf (subhandlers.go).
//
// It is pure: it imports processing/causes and state only, never client-go, the
// Lua binding or a clock; it keeps no state and takes no lock. Its callers own the
// records, the time and the I/O.
package handling
