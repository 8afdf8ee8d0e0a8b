-- kopf's examples/13-hooks: operator-level hooks. Startup handlers run before any
-- object is handled (retried until they succeed), cleanup handlers when the
-- operator stops, probes answer /healthz. kopf serves every pod from a background
-- task it starts on the pod's first event; in luaop that task is a daemon. (kopf's
-- on.login has no counterpart: luaop authenticates as kubectl does.)
local luaop = require("luaop")

luaop.on.startup(function(ctx)
  ctx.logger.info("Initialising the task-lock...")
  ctx.memo.started_at = os.time()
end, { id = "startup_fn_simple" })

luaop.on.startup(function(ctx)
  if ctx.retry < 3 then
    error(luaop.temporary_error("Going to succeed in " .. (3 - ctx.retry) .. "s", 1))
  end
  ctx.logger.info("Starting retried...")
end, { id = "startup_fn_retried" })

luaop.on.cleanup(function(ctx)
  ctx.logger.info("Cleaning up...")
  -- The daemons are stopped by the operator itself.
  ctx.logger.info("All pod-tasks are requested to stop...")
end, { id = "cleanup_fn" })

-- The pods being served, by namespace: what the probes report.
luaop.index("v1/pods", function(ctx)
  return { [ctx.namespace] = ctx.name }
end, { id = "served_pods" })

luaop.on.probe(function(ctx)
  local n = 0
  for _, names in pairs(ctx.indexes.served_pods) do n = n + #names end
  return n
end, { id = "tasks_count" })

luaop.on.probe(function(ctx)
  local out = {}
  for namespace, names in pairs(ctx.indexes.served_pods) do
    out[namespace] = luaop.array()
    for _, name in ipairs(names) do table.insert(out[namespace], name) end
    table.sort(out[namespace])
  end
  return out
end, { id = "monitored_objects" })

luaop.daemon("v1/pods", function(ctx)
  while luaop.sleep(math.random(1, 3)) do
    ctx.logger.info("Served by the background task.")
  end
  ctx.logger.info("Serving is finished by request.")
end, { id = "pod_task" })
