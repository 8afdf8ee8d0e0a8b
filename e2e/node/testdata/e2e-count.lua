-- Added by the node suite (e2e/node) to the examples' scripts ConfigMap, through
-- `kubectl apply -k`: handler runs counted on the cluster (a ConfigMap per run of the
-- create handler, so a second run of one Widget's handler shows as a second
-- ConfigMap), a probe handler the suite can make fail, and a memory bomb.
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

-- A memory bomb: one concatenation of 512 MiB, past the pod's 384Mi limit in a
-- single step from a heap far under the memory budget (a doubling loop races the
-- budget's sampler instead, and its outcome varies). Stopped by a cap on
-- concatenation, or by the kernel's OOM killer.
luaop.on.create(WIDGETS, function(ctx)
  local p = string.rep("0123456789abcdef", 1024 * 1024) -- 16 MiB, string.rep's largest
  local s = p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p
    .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p .. p
  return { length = #s }
end, { id = "bomb", labels = { ["e2e.luaop.dev/bomb"] = "yes" }, errors = "permanent" })

-- Fails while the ConfigMap e2e-liveness of luaop-system says fail = "true". Its
-- first run in a Lua state says so in the log: the suite reads it in each pod's log
-- to see this file's code run there (/readyz runs the probe handlers of every
-- replica, the standby's too).
local announced = false
luaop.on.probe(function(ctx)
  if not announced then
    announced = true
    ctx.logger.info("e2e-count.lua runs")
  end
  local cm = luaop.kube.get("v1", "ConfigMap", "luaop-system", "e2e-liveness")
  if cm and cm.data and cm.data.fail == "true" then
    error("e2e-liveness says fail")
  end
  return "ok"
end, { id = "e2e-liveness" })
