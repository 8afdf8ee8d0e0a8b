-- A daemon: one long-running task per Monitor, while the Monitor exists. It checks
-- that a ConfigMap exists every spec.period seconds and reports in status. It stops
-- when the Monitor is deleted (the finalizer holds the deletion until it exits) and
-- keeps running across script reloads as long as its code is unchanged.
local luaop = require("luaop")

luaop.daemon("examples.luaop.dev/v1/monitors", function(ctx)
  local checks = 0
  while not ctx.stopped() do
    -- ctx.spec is always the newest spec: edit the Monitor and the loop follows.
    -- A Monitor without spec.configmap watches nothing, and says so.
    local name = ctx.spec.configmap
    local cm = name and luaop.kube.get("v1", "ConfigMap", ctx.namespace, name)
    checks = checks + 1
    ctx.patch.status.found = cm ~= nil
    ctx.patch.status.checks = checks
    -- sleep yields: a sleeping daemon costs no CPU and holds no Lua state.
    luaop.sleep(ctx.spec.period or 5)
  end
  ctx.logger.info("monitor stopped after", checks, "checks")
end, { id = "watcher", cancellation_timeout = 10 })
