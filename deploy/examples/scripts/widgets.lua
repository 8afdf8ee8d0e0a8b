-- A first handler: greet every new Widget; a field handler that follows spec.size
-- only (changes of other fields do not call it); admission handlers checking and
-- defaulting spec.size before a Widget is stored. Handlers read objects defensively:
-- any field a CRD does not require may be missing (ctx.spec and ctx.status are empty
-- tables then, ctx.old of an admission request is the whole old object).
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

-- Admission (kopf's on.validate and on.mutate): the API server asks these before it
-- stores a Widget, so a bad one is refused by `kubectl apply` itself. They need the
-- webhook server: on in `luaop dev`, `--webhook-address` in `luaop run`.
-- failure_policy = "Ignore": when the operator is down or the handler fails, widgets
-- are still accepted (the default, "Fail", refuses them).
luaop.on.validate(WIDGETS, function(ctx)
  local size = ctx.spec.size
  if size ~= nil and (type(size) ~= "number" or size < 1 or size > 100) then
    return false, "spec.size must be a number from 1 to 100, got " .. tostring(size)
  end
  local old_spec = (ctx.old and ctx.old.spec) or {}
  if ctx.operation == "UPDATE" and old_spec.size ~= nil and size == nil then
    table.insert(ctx.warnings, "spec.size removed: the widget gets size 1 again only on creation")
  end
end, { id = "check-size", operations = { "CREATE", "UPDATE" }, failure_policy = "Ignore" })

luaop.on.mutate(WIDGETS, function(ctx)
  -- What ctx.patch holds becomes the response's JSON patch.
  if ctx.spec.size == nil then ctx.patch.spec.size = 1 end
end, { id = "default-size", operations = "CREATE", failure_policy = "Ignore" })

-- A liveness probe: its result shows on the operator's /healthz (kopf's on.probe).
luaop.on.probe(function(ctx)
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end, { id = "now" })
