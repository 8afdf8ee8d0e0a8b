-- kopf's examples/03-exceptions: how errors end handlers. A permanent error fails
-- at once; a temporary one is retried after its delay; any other error is retried
-- after the backoff, until retries run out, or fails at once with errors = "permanent".
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

luaop.on.create(resource, function(ctx)
  error(luaop.permanent_error("Fail once and for all."))
end, { id = "instant_failure_with_only_a_message" })

luaop.on.create(resource, function(ctx)
  if ctx.retry < 3 then -- 0, 1, 2, 3
    error(luaop.temporary_error("Expected recoverable error.", 1))
  end
end, { id = "eventual_success_with_a_few_messages" })

luaop.on.create(resource, function(ctx)
  error("An error that is supposed to be recoverable.")
end, { id = "eventual_failure_with_tracebacks", retries = 3, backoff = 1 })

luaop.on.create(resource, function(ctx)
  error("An error that is supposed to be recoverable.")
end, { id = "instant_failure_with_traceback", errors = "permanent", backoff = 1 })
