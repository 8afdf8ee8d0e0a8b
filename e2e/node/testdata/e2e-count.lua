-- Added by the node suite (e2e/node) to the examples' scripts ConfigMap, through
-- `kubectl apply -k`: handler runs counted on the cluster (a ConfigMap per run of the
-- create handler, so a second run of one Widget's handler shows as a second
-- ConfigMap), a liveness probe the suite can make fail, and a memory bomb.
local luaop = require("luaop")
local WIDGETS = "examples.luaop.dev/v1/widgets"

luaop.on.create(WIDGETS, function(ctx)
  local _, err = luaop.kube.create({
    apiVersion = "v1", kind = "ConfigMap",
    metadata = {
      generateName = "run-" .. ctx.name .. "-", namespace = ctx.namespace,
      labels = { ["e2e.luaop.dev/widget"] = ctx.name },
    },
    data = { handler = "count" },
  })
  if err then error("counting the run: " .. err) end
  return { counted = true }
end, { id = "count", labels = { ["e2e.luaop.dev/bomb"] = luaop.ABSENT } })

-- A string doubled until something stops it: the memory budget, or the kernel's
-- OOM killer at the pod's 384Mi limit.
luaop.on.create(WIDGETS, function(ctx)
  local s = "0123456789abcdef"
  while true do s = s .. s end
end, { id = "bomb", labels = { ["e2e.luaop.dev/bomb"] = "yes" }, errors = "permanent" })

-- Fails while the ConfigMap e2e-liveness of luaop-system says fail = "true".
luaop.on.probe(function(ctx)
  local cm = luaop.kube.get("v1", "ConfigMap", "luaop-system", "e2e-liveness")
  if cm and cm.data and cm.data.fail == "true" then
    error("e2e-liveness says fail")
  end
  return "ok"
end, { id = "e2e-liveness" })
