-- kopf's examples/99-all-at-once: most of the above in one operator.
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

luaop.on.startup(function(ctx)
  ctx.logger.info("Starting in 1s...")
  luaop.sleep(1)
end, { id = "startup_fn_simple" })

luaop.on.startup(function(ctx)
  if ctx.retry < 3 then
    error(luaop.temporary_error("Going to succeed in " .. (3 - ctx.retry) .. "s", 1))
  end
  ctx.logger.info("Starting retried...")
end, { id = "startup_fn_retried" })

luaop.on.cleanup(function(ctx)
  ctx.logger.info("Cleaning up in 3s...")
  luaop.sleep(3)
end, { id = "cleanup_fn" })

local function create_children(owner)
  return {}
end

luaop.on.create(resource, function(ctx)
  local children = create_children(ctx.body)
  luaop.info(ctx.body, "AnyReason")
  luaop.event(ctx.body, "Warning", "SomeReason", "Cannot do something")
  luaop.event(children, "Normal", "SomeReason", "Created as part of the job1step")
  return { ["job1-status"] = 100 }
end, { id = "create_1" })

local function wait_for_something()
  luaop.sleep(1) -- e.g. an external API poller
end

luaop.on.create(resource, function(ctx)
  wait_for_something()
  if ctx.retry == 0 then
    error("Whoops!") -- retried by the framework, even if it has been restarted
  end
  return { ["job2-status"] = 100 }
end, { id = "create_2" })

luaop.on.update(resource, function(ctx)
  ctx.logger.info("Handling the diff: " .. luaop.json.encode(ctx.diff))
end, { id = "update" })

luaop.on.field(resource, "spec.lst", function(ctx)
  ctx.logger.info("Handling the FIELD = " .. luaop.json.encode(ctx.old) .. " -> " .. luaop.json.encode(ctx.new))
end, { id = "update_lst" })

luaop.on.delete(resource, function(ctx) end, { id = "delete" })

luaop.on.create(resource, function(ctx)
  local pod = luaop.yaml.decode([[
apiVersion: v1
kind: Pod
spec:
  containers:
  - name: the-only-one
    image: busybox
    command: ["sh", "-x", "-c", "sleep 1"]
]])
  -- Make it our child: assign the namespace, name, labels, owner references, etc.
  luaop.adopt(pod)
  luaop.label(pod, { application = "kopf-example-10" })
  local created, err = luaop.kube.create(pod)
  if created == nil then error("creating the pod: " .. err) end
end, { id = "create_pod" })

luaop.on.event("v1/pods", function(ctx)
  ctx.logger.info("This pod is special for us.")
end, { id = "example_pod_change", labels = { application = "kopf-example-10" } })
