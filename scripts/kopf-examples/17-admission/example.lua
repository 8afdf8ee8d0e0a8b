-- kopf's examples/17-admission: validating and mutating admission handlers, served
-- by the operator's webhook server (luaop run --webhook-address; luaop dev serves
-- one on loopback and registers it). kopf configures its server in a startup
-- handler; luaop by flags (--webhook-url, --webhook-service, --webhook-cert-dir,
-- --webhook-client-ca).
local luaop = require("luaop")
local resource = "kopf.dev/v1/kex"

luaop.on.validate(resource, function(ctx)
  local user_agent = ctx.headers["User-Agent"] or "(unidentified)"
  table.insert(ctx.warnings, "Accessing as user-agent: " .. user_agent)
  if ctx.sslpeer == nil then
    table.insert(ctx.warnings, "SSL peer is not identified.")
  elseif ctx.sslpeer.subject.commonName then
    table.insert(ctx.warnings, "SSL peer is " .. ctx.sslpeer.subject.commonName .. ".")
  else
    table.insert(ctx.warnings, "SSL peer's common name is absent.")
  end
end, { id = "authhook" })

luaop.on.validate(resource, function(ctx)
  if not ctx.dryrun and ctx.spec.field == "wrong" then
    error(luaop.admission_error("Meh! I don't like it. Change the field."))
  end
end, { id = "validate1" })

luaop.on.validate(resource, function(ctx)
  error(luaop.admission_error("I'm too lazy anyway. Go away!", 555))
end, { id = "validate2", field = "spec.field", value = "not-allowed" })

luaop.on.validate(resource, function(ctx)
  if ctx.subresource == "status" and ctx.status.field ~= ctx.spec.field then
    error(luaop.admission_error("status.field MUST be equal to spec.field!"))
  elseif ctx.subresource == nil and ctx.status.field ~= ctx.spec.field then
    table.insert(ctx.warnings, "Also update status.field to match spec.field: " ..
      tostring(ctx.spec.field) .. " != " .. tostring(ctx.status.field))
  end
end, { id = "validate_subresources", subresource = "*" })

luaop.on.mutate(resource, function(ctx)
  ctx.logger.info("mutating on " .. ctx.operation)
  ctx.patch.spec.injected = 123
end, { id = "mutate1", labels = { somelabel = "somevalue" } })
