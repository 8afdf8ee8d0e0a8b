-- kopf's examples/08-events: raw watch events, every one of them, never retried;
-- a failing event handler is logged and ignored.
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

luaop.on.event(resource, function(ctx)
  error("Oops!")
end, { id = "event_fn_with_error" })

luaop.on.event(resource, function(ctx)
  ctx.logger.info("Event received: " .. ctx.type .. " " .. ctx.name)
end, { id = "normal_event_fn" })
