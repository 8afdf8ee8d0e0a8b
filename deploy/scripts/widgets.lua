-- A first handler: greet every new Widget, and keep its size in the status.
local luaop = require("luaop")

luaop.on.create("examples.luaop.dev/v1/widgets", function(ctx)
  ctx.logger.info("a widget was created with size", ctx.spec.size)
  -- What a handler returns lands in status.<handler id>: status.greet here.
  return { message = "hello from Lua", size = ctx.spec.size }
end, { id = "greet" })
