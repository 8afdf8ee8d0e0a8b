-- kopf's examples/04-events: Kubernetes Events about the handled object (or any
-- other, or a list of them).
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx)
  -- The all-purpose function for the event creation: any type.
  luaop.event(ctx.body, "SomeType", "SomeReason", "Some message")

  -- The shortcuts for the conventional events and common cases.
  luaop.info(ctx.body, "SomeReason", "Some message")
  luaop.warn(ctx.body, "SomeReason", "Some message")

  local ok, err = pcall(error, "Exception text.", 0)
  if not ok then
    luaop.exception(ctx.body, "SomeReason", "Some exception:", err)
  end
end, { id = "create_fn" })
