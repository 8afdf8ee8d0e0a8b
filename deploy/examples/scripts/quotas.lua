-- A timer: every 10 seconds (aligned to the schedule: sharp), count the ConfigMaps of
-- the Quota's namespace and report the usage. Runs of one timer never overlap.
local luaop = require("luaop")

luaop.timer("examples.luaop.dev/v1/quotas", function(ctx)
  local list, err = luaop.kube.list("v1", "ConfigMap", ctx.namespace)
  if not list then
    error(luaop.temporary_error("cannot list ConfigMaps: " .. err, 5))
  end
  local used = #list
  local max = tonumber(ctx.spec.maxConfigMaps) or 0 -- a Quota without it allows none
  if used > max then
    luaop.warn(ctx.body, "OverQuota", used .. " ConfigMaps, the quota allows " .. max)
  end
  -- The return value lands in status.usage.
  return { used = used, over = used > max }
end, { id = "usage", interval = 10, sharp = true })
