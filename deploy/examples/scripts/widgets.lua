-- A first handler: greet every new Widget; and a field handler that follows
-- spec.size only (changes of other fields do not call it).
local luaop = require("luaop")
local WIDGETS = "examples.luaop.dev/v1/widgets"

luaop.on.create(WIDGETS, function(ctx)
  ctx.logger.info("a widget was created with size", ctx.spec.size)
  -- What a handler returns lands in status.<handler id>: status.greet here.
  return { message = "hello from Lua", size = ctx.spec.size }
end, { id = "greet" })

luaop.on.field(WIDGETS, "spec.size", function(ctx)
  -- ctx.old and ctx.new are the field's values; ctx.diff lists its changes.
  ctx.logger.info("size changed from", tostring(ctx.old), "to", tostring(ctx.new))
  ctx.patch.status.resized = (ctx.status.resized or 0) + (ctx.old and 1 or 0)
  return { from = ctx.old, to = ctx.new }
end, { id = "size" })

-- A liveness probe: its result shows on the operator's /healthz (kopf's on.probe).
luaop.on.probe(function(ctx)
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end, { id = "now" })
