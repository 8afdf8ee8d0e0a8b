-- kopf's examples/10-builtins: built-in resources (Pods) are handled as custom ones.
-- Every Pod outside kube-* namespaces is killed 30 s after it is seen, unless it
-- goes first. kopf starts an asyncio task per pod; in luaop that task is a daemon,
-- whose luaop.sleep returns false when the pod goes.
local luaop = require("luaop")
local delay = 30

local function outside_kube_namespaces(ctx)
  return ctx.namespace ~= nil and ctx.namespace:find("^kube%-") == nil
end

-- One function for two causes, under one id (kopf's @kopf.on.resume and
-- @kopf.on.create on one function): pods found at start and pods created since.
local function pod_in_sight(ctx)
  ctx.logger.info("=== Pod killing happens in " .. delay .. "s.")
end
luaop.on.resume("v1/pods", pod_in_sight, { id = "pod_in_sight", when = outside_kube_namespaces })
luaop.on.create("v1/pods", pod_in_sight, { id = "pod_in_sight", when = outside_kube_namespaces })

luaop.daemon("v1/pods", function(ctx)
  if luaop.sleep(delay) then
    ctx.logger.info("=== Pod killing happens NOW!")
    luaop.kube.delete("v1", "Pod", ctx.namespace, ctx.name)
  else
    ctx.logger.info("=== Pod killing is cancelled!")
  end
end, { id = "pod_killer", when = outside_kube_namespaces })

luaop.on.delete("v1/pods", function(ctx)
  ctx.logger.info("=== Pod is gone.")
end, { id = "pod_deleted", when = outside_kube_namespaces })
