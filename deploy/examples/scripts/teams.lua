-- An index: Tenants indexed by their team (tenants.lua handles the Tenants
-- themselves); every handler can look the index up. A Team lists its members.
local luaop = require("luaop")

luaop.index("examples.luaop.dev/v1/tenants", function(ctx)
  local team = ctx.spec.team
  if type(team) ~= "string" or team == "" then return nil end -- not in the index
  return { [team] = ctx.name }
end, { id = "tenants_by_team" })

local function members(ctx)
  local names = luaop.array() -- stays a JSON list even when empty
  for _, name in ipairs(ctx.indexes.tenants_by_team[ctx.name] or {}) do
    table.insert(names, name)
  end
  table.sort(names)
  return { members = names, count = #names }
end

luaop.on.create("examples.luaop.dev/v1/teams", members, { id = "roster" })
-- Tenants join later: refresh the roster every 15 s.
luaop.timer("examples.luaop.dev/v1/teams", function(ctx)
  ctx.patch.status.roster = members(ctx)
end, { id = "roster_refresh", interval = 15 })
