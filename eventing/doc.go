// Package eventing is the operator's one Kubernetes Events recorder: the framework's
// handler outcomes and the scripts' luaop.info/warn/exception go through the same
// client-go broadcaster, so one correlator rate-limits and aggregates them all.
//
// It owns the broadcaster and its recorder (started at the first Event, stopped by
// Shutdown). Its mutex is a leaf: it guards starting and closing, never held while
// an Event is posted. It imports nothing of luaop: kubeclient (the scripts' Events)
// and operator (the framework's) call it, never the other way round.
package eventing
