-- A ConfigMap per Generator: created with the Generator as its owner, so Kubernetes
-- deletes it with the Generator; kept in sync when spec.data changes.
local luaop = require("luaop")
local GENERATORS = "examples.luaop.dev/v1/generators"

local function desired(ctx)
  local cm = {
    apiVersion = "v1",
    kind = "ConfigMap",
    metadata = { name = ctx.name .. "-generated" },
    data = {},
  }
  -- spec.data may be missing; ConfigMap values must be strings.
  local data = ctx.spec.data
  if type(data) == "table" then
    for k, v in pairs(data) do cm.data[k] = tostring(v) end
  end
  luaop.label(cm, { ["app.kubernetes.io/managed-by"] = "luaop" })
  return luaop.adopt(cm) -- owner reference to the Generator, same namespace
end

local function sync(ctx)
  -- Server-side apply: creates or updates, owned by luaop's field manager.
  local cm, err = luaop.kube.apply(desired(ctx))
  if not cm then
    error(luaop.temporary_error("cannot apply the ConfigMap: " .. err, 5))
  end
  return { configmap = cm.metadata.name }
end

luaop.on.create(GENERATORS, sync, { id = "configmap" })
luaop.on.update(GENERATORS, sync, { id = "configmap_sync" })
