// Package operator assembles a running operator: the Lua runtime (luabind) loaded
// from a scripts folder, and the processing core (processing) watching the resources
// the scripts registered for. cmd/luaop and the test harness both start operators
// through it, so tests run exactly what users run.
//
// It owns the operator's lifetime around the core: the first load and reloads of the
// scripts (LoadScripts), the operator-level hooks (startup and cleanup, run as kopf
// runs activities, and probe), the Events sink and the operator's metrics. The rules
// of a hook's run (the verdict on an attempt, its backoff) are handling's: it must not
// decide them again. It must not reach into the core's or the runtime's state:
// it calls their exported API only, and it never imports cmd/.
package operator
