package operator

import (
	"errors"
	"fmt"

	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/processing"
)

// Instrument feeds m from the processing core: watch events, patches, the work queue
// (per resource), every cycle (controller-runtime's reconcile metrics) and every
// handler run (Lua errors counted apart). A handler-run callback already in p is
// kept and called first. AttachMetrics adds what the running operator knows.
func Instrument(p *processing.Options, m *metrics.Metrics) {
	p.Observer, p.QueueMetrics = m, m.WorkqueueProvider()
	previous := p.OnHandlerRun
	p.OnHandlerRun = func(r processing.HandlerRun) {
		if previous != nil {
			previous(r)
		}
		var se *luabind.ScriptError
		// Subhandlers are counted as their top-level handler: their ids come from
		// data (one per item of a list), which would make series without bound.
		id := r.MetricID
		if id == "" {
			id = r.HandlerID
		}
		m.HandlerRun(r.Controller, id, r.Reason, string(r.Outcome), r.Duration, errors.As(r.Err, &se))
		if r.Outcome == processing.OutcomeFailure {
			m.TerminalError(r.Controller) // given up: controller-runtime's TerminalError
		}
	}
}

// AttachMetrics adds to m what the operator reports at scrape time: the daemons
// running and the timers scheduled, and the scripts' own metrics
// (luaop.metrics).
func (o *Operator) AttachMetrics(m *metrics.Metrics) error {
	m.EngineCounts(o.reactor.EngineCounts)
	if err := m.Registry().Register(o.runtime.Metrics()); err != nil {
		return fmt.Errorf("registering the scripts' metrics: %w", err)
	}
	if err := m.Registry().Register(o.runtime.BudgetMetrics()); err != nil {
		return fmt.Errorf("registering the Lua budgets' metrics: %w", err)
	}
	return nil
}
