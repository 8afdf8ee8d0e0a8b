-- A handler of ConfigMaps labelled hello.luaop.dev/greet=yes, using a module of a
-- sub-folder (lib/greeting.lua, shipped as the ConfigMap key lib__greeting.lua).
local luaop = require("luaop")
local greeting = require("lib.greeting")

luaop.on.create("v1/configmaps", function(ctx)
  ctx.logger.info(greeting.hello(ctx.name))
end, { id = "hello", labels = { ["hello.luaop.dev/greet"] = "yes" } })
