-- kopf's examples/05-handlers: every kind of change handler. Resume handlers run for
-- objects found when the operator starts; a field handler for changes of its field.
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

luaop.on.resume(resource, function(ctx) ctx.logger.info("RESUMED 1st") end, { id = "resume_fn_1" })
luaop.on.create(resource, function(ctx) ctx.logger.info("CREATED 1st") end, { id = "create_fn_1" })
luaop.on.resume(resource, function(ctx) ctx.logger.info("RESUMED 2nd") end, { id = "resume_fn_2" })
luaop.on.create(resource, function(ctx) ctx.logger.info("CREATED 2nd") end, { id = "create_fn_2" })

luaop.on.update(resource, function(ctx)
  ctx.logger.info("UPDATED")
end, { id = "update_fn" })

luaop.on.delete(resource, function(ctx) ctx.logger.info("DELETED 1st") end, { id = "delete_fn_1" })
luaop.on.delete(resource, function(ctx) ctx.logger.info("DELETED 2nd") end, { id = "delete_fn_2" })

luaop.on.field(resource, "spec.field", function(ctx)
  ctx.logger.info("FIELD CHANGED: " .. tostring(ctx.old) .. " -> " .. tostring(ctx.new))
end, { id = "field_fn" })
