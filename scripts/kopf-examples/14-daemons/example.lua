-- kopf's examples/14-daemons: a daemon per object while it exists. The first one
-- checks ctx.stopped() (kopf's sync daemons); the second relies on its cancellation
-- (kopf's async daemons): after its stop, the sleep that tells it returns false, and
-- its next blocking call, cancellation_backoff later, ends it.
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

-- It fails 3 times, then runs for 30 seconds (unless stopped).
luaop.daemon(resource, function(ctx)
  if ctx.retry < 3 then
    ctx.patch.status.message = "Failed " .. (ctx.retry + 1) .. " times."
    error(luaop.temporary_error("Simulated failure.", 1))
  end
  local started = os.time()
  while not ctx.stopped() and os.time() - started <= 30 do
    ctx.logger.info("=> Ping from a sync daemon: field=" .. tostring(ctx.spec.field) .. ", retry=" .. ctx.retry)
    luaop.sleep(5)
  end
  ctx.patch.status.message = "Accompanying is finished."
end, { id = "background_sync", backoff = 3 })

-- It runs forever (until stopped, i.e. cancelled), after failing to start 3 times.
luaop.daemon(resource, function(ctx)
  if ctx.retry < 3 then
    error(luaop.temporary_error("Simulated failure.", 1))
  end
  while true do
    ctx.logger.info("=> Ping from an async daemon: field=" .. tostring(ctx.spec.field))
    luaop.sleep(5)
  end
end, { id = "background_async", backoff = 3, cancellation_backoff = 1, cancellation_timeout = 0.5,
       annotations = { someannotation = "somevalue" } })
