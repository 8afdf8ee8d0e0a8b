-- A module: loaded by require("lib.greeting"), not run as a handler script.
local M = {}

function M.hello(name)
  return "hello, " .. name
end

return M
