-- kopf's examples/15-timers: timers that run every few seconds once the object has
-- been left alone for a while (idle).
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

luaop.timer(resource, function(ctx)
  ctx.logger.info("Ping from a sync timer: field=" .. tostring(ctx.spec.field))
end, { id = "every_few_seconds_sync", idle = 5, interval = 2 })

luaop.timer(resource, function(ctx)
  ctx.logger.info("Ping from an async timer: field=" .. tostring(ctx.spec.field))
end, { id = "every_few_seconds_async", idle = 10, interval = 4 })
