-- kopf's examples/12-embedded: the operator inside another program, which hands it
-- a memo. luaop embeds as Go (operator.New in your program, as e2e/ does); the memo
-- an embedding program would pass is filled by a startup handler here, and every
-- object's memo starts as a copy of it.
local luaop = require("luaop")

luaop.on.startup(function(ctx)
  ctx.memo.create_tpl = "Hello, %s!"
  ctx.memo.delete_tpl = "Good bye, %s!"
end, { id = "memo" })

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx)
  ctx.logger.info(string.format(ctx.memo.create_tpl, ctx.name))
end, { id = "create_fn" })

luaop.on.delete("kopf.dev/v1/kopfexamples", function(ctx)
  ctx.logger.info(string.format(ctx.memo.delete_tpl, ctx.name))
end, { id = "delete_fn" })
