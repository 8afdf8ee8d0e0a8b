-- A delete handler with cleanup: each Tenant is listed in a registry ConfigMap of
-- another namespace. Owner references cannot cross namespaces, so the operator must
-- remove the entry itself before the Tenant goes (a finalizer holds it meanwhile).
local luaop = require("luaop")
local TENANTS = "examples.luaop.dev/v1/tenants"

local function registry_name(ctx) return "tenant-registry" end

local function registry_namespace(ctx)
  local ns = ctx.spec.registry
  if type(ns) ~= "string" or ns == "" then return "default" end
  return ns
end

luaop.on.create(TENANTS, function(ctx)
  local key = ctx.namespace .. "." .. ctx.name
  local patch = { data = { [key] = ctx.uid } }
  local cm, err, reason = luaop.kube.patch("v1", "ConfigMap", registry_namespace(ctx), registry_name(ctx), patch)
  if reason == "NotFound" then
    cm, err = luaop.kube.create({
      apiVersion = "v1", kind = "ConfigMap",
      metadata = { name = registry_name(ctx), namespace = registry_namespace(ctx) },
      data = { [key] = ctx.uid },
    })
  end
  if not cm then error(luaop.temporary_error("registry not updated: " .. err, 2)) end
  ctx.logger.info("registered tenant", key)
  return { registered = key }
end, { id = "register" })

luaop.on.delete(TENANTS, function(ctx)
  local key = ctx.namespace .. "." .. ctx.name
  -- JSON null removes the key from the ConfigMap.
  local _, err, reason = luaop.kube.patch("v1", "ConfigMap", registry_namespace(ctx), registry_name(ctx),
    { data = { [key] = luaop.null } })
  if err and reason ~= "NotFound" then
    error(luaop.temporary_error("registry not cleaned: " .. err, 2))
  end
  ctx.logger.info("unregistered tenant", key)
end, { id = "unregister" })
