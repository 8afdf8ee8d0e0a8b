-- kopf's examples/06-peering: an operator whose instances must not handle one object
-- at once. Operators of one prefix coordinate through Leases, as kopf's peering
-- objects (--priority, --peering-namespace, --standalone; README "peering"); the
-- replicas of one Deployment take turns by leader election (--leader-elect). The
-- handler is the same.
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx) end, { id = "create_fn" })
