-- kopf's examples/09-testing: an operator tested the way its users test it, by
-- running it against a cluster and reading its log (kopf.testing.KopfRunner there,
-- e2e/kopf_examples_test.go here). Without a cluster: luaop test (see tests/).
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx)
  ctx.logger.info("Something was logged here.")
end, { id = "create_fn" })
