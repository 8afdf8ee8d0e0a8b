-- kopf's examples/01-minimal: one create handler; what it returns lands in
-- status.create_fn.
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx)
  ctx.logger.info("And here we are! Creating: " .. luaop.json.encode(ctx.spec))
  return { message = "hello world" } -- will be the new status
end, { id = "create_fn" })
