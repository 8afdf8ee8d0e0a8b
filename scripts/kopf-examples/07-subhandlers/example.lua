-- kopf's examples/07-subhandlers: a handler that registers one child handler per
-- item; each child has its own progress (status of create_fn/<item>), and the parent
-- is done when they all are.
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx)
  for _, item in ipairs(ctx.spec.items or {}) do
    ctx.subhandler(function(sub)
      sub.logger.info("=== Handling creation for " .. item .. ". ===")
    end, { id = item })
  end
end, { id = "create_fn" })
