-- kopf's examples/06-peering: an operator whose replicas must not handle one object
-- at once. luaop's replicas take turns through leader election (--leader-elect),
-- not kopf's peering objects; the handler is the same.
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx) end, { id = "create_fn" })
