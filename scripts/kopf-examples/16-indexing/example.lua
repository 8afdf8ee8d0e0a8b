-- kopf's examples/16-indexing: indexes of Pods, keyed by tables compared by value
-- (kopf's tuples), read by probes and by a timer of another resource.
local luaop = require("luaop")

luaop.index("v1/pods", function(ctx)
  return { [{ ctx.namespace, ctx.name }] = ctx.status.phase == "Running" }
end, { id = "is_running" })

luaop.index("v1/pods", function(ctx)
  local out = {}
  for label, value in pairs(ctx.labels) do out[{ label, value }] = ctx.name end
  return out
end, { id = "by_label" })

luaop.on.probe(function(ctx)
  return #ctx.indexes.is_running
end, { id = "pod_count" })

luaop.on.probe(function(ctx)
  local names = luaop.array()
  for key in pairs(ctx.indexes.is_running) do table.insert(names, key[2]) end
  return names
end, { id = "pod_names" })

luaop.timer("kopf.dev/v1/kex", function(ctx)
  local labels = {}
  for key, names in pairs(ctx.indexes.by_label) do
    table.insert(labels, key[1] .. "=" .. key[2] .. ": " .. table.concat(luaop.array(names), ","))
  end
  ctx.logger.info("pods by label: " .. table.concat(labels, "; "))
  local running = luaop.array()
  for key, values in pairs(ctx.indexes.is_running) do
    local ns, name = key[1], key[2]
    if (ns == "kube-system" or ns == "default" or ns == ctx.namespace) and values[1] then
      table.insert(running, ns .. "::" .. name)
    end
  end
  ctx.patch.status["running-pods"] = running
end, { id = "intervalled", interval = 5 })
