package ledger

import "strings"

// Lua defines `ledger.ran(ctx, handler, change, gen)` for a script that starts with
// it: it records the run (a ConfigMap in the object's namespace, labelled RunLabel,
// through luaop.kube: a failed record fails the handler, which is retried 0.5 s
// later), stamps
// the object's annotation ledger.luaop.dev/<handler> with its uid through ctx.patch
// (the prefix is marked as an operator's, ledger.luaop.dev/luaop-managed, so that the
// stamps are not part of the object's essence: no update cause),
// and returns {change, gen, uid}, which the handler returns (status.<handler>).
// Call it last: a handler that recorded its run has done its work.
const Lua = `
local luaop = require("luaop")
local ledger = {}
function ledger.ran(ctx, handler, change, gen)
  gen = gen or (ctx.spec and ctx.spec.gen) or 0
  local record = {
    apiVersion = "v1", kind = "ConfigMap",
    metadata = { generateName = "run-", namespace = ctx.namespace, labels = { ["` + RunLabel + `"] = "1" } },
    data = { handler = handler, uid = ctx.uid, object = ctx.namespace .. "/" .. ctx.name, change = change, gen = tostring(gen) },
  }
  local made, err = luaop.kube.create(record)
  if made == nil then
    -- A temporary error: retried soon (an arbitrary error waits the handler's backoff, 60 s).
    error(luaop.temporary_error("ledger: recording the run of " .. handler .. " on " .. ctx.name .. ": " .. tostring(err), 0.5))
  end
  -- Under a prefix marked as an operator's: not part of the object's essence, so the
  -- stamp is no change that update handlers would see.
  ctx.patch.metadata.annotations["ledger.luaop.dev/luaop-managed"] = "yes"
  ctx.patch.metadata.annotations["ledger.luaop.dev/" .. handler] = ctx.uid
  return { change = change, gen = gen, uid = ctx.uid }
end
`

// RunLabel labels the run records.
const RunLabel = "ledger.luaop.dev/run"

// RunSelector selects the run records.
const RunSelector = RunLabel + "=1"

// Script is src with Lua before it (one file's own helper: files do not share globals).
func Script(src string) string {
	return Lua + "\n" + strings.TrimLeft(src, "\n")
}
