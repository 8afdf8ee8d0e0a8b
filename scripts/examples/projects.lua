-- A tenant's Project, cluster-scoped: a Namespace of its name with a ResourceQuota
-- and a LimitRange, each owned by the Project (owner references: Kubernetes deletes
-- them with it). Its children are healed without a timer: a hand edit of what the
-- Project sets is reverted, a deleted child re-created, because each change of an
-- owned object runs the Project's handler (luaop.on.related, owned).
--
-- (A RoleBinding is the other usual child; creating one needs the operator to hold
-- the role's permissions or RBAC's bind verb on it, which `luaop rbac` does not
-- grant: add it to your own overlay's Role before adding one here.)
local luaop = require("luaop")
local PROJECTS = "examples.luaop.dev/v1/projects"

-- What the Project wants, by kind.
local function owner(ctx) return { luaop.owner_reference(ctx.body) } end

local function namespace_of(ctx)
  return { apiVersion = "v1", kind = "Namespace",
    metadata = { name = ctx.name, labels = { ["examples.luaop.dev/project"] = ctx.name }, ownerReferences = owner(ctx) } }
end

local function quota_of(ctx)
  local hard = {}
  for k, v in pairs(ctx.spec.quota or { pods = "10" }) do hard[k] = tostring(v) end
  return { apiVersion = "v1", kind = "ResourceQuota",
    metadata = { name = "project", namespace = ctx.name, ownerReferences = owner(ctx) },
    spec = { hard = hard } }
end

local function limits_of(ctx)
  return { apiVersion = "v1", kind = "LimitRange",
    metadata = { name = "project", namespace = ctx.name, ownerReferences = owner(ctx) },
    spec = { limits = { { type = "Container", default = { memory = ctx.spec.defaultMemory or "256Mi" } } } } }
end

local CHILDREN = { Namespace = namespace_of, ResourceQuota = quota_of, LimitRange = limits_of }
local ORDER = { "Namespace", "ResourceQuota", "LimitRange" } -- the namespace first

-- Applying each child (server-side apply); a call per kind, so that `luaop rbac`
-- sees what each needs.
local APPLY = {
  Namespace = function(ctx) return luaop.kube.apply(namespace_of(ctx)) end,
  ResourceQuota = function(ctx) return luaop.kube.apply(quota_of(ctx)) end,
  LimitRange = function(ctx) return luaop.kube.apply(limits_of(ctx)) end,
}

-- contains tells whether have holds everything of want (what others add is theirs).
local function contains(have, want)
  if type(want) ~= "table" then return have == want end
  if type(have) ~= "table" then return false end
  for k, v in pairs(want) do
    if not contains(have[k], v) then return false end
  end
  return true
end

local function apply(ctx, kind)
  local _, err, reason = APPLY[kind](ctx)
  if not err then return end
  if reason == "Forbidden" and tostring(err):find("being terminated", 1, true) then
    -- A deleted namespace goes once its content is gone: re-created after that.
    error(luaop.temporary_error("namespace " .. ctx.name .. " is being deleted; re-creating it once it is gone", 2))
  end
  error(luaop.temporary_error("applying the " .. kind .. " of project " .. ctx.name .. ": " .. err, 2))
end

local function provision(ctx)
  if ctx.reason ~= "related" then
    for _, kind in ipairs(ORDER) do apply(ctx, kind) end
    return { namespace = ctx.name }
  end
  -- A child changed: put back what drifted (another writer's additions stay, as
  -- server-side apply leaves them), re-create what is gone.
  local drifted = {}
  for _, r in ipairs(ctx.related) do
    local w = CHILDREN[r.kind] and CHILDREN[r.kind](ctx)
    if w and (r.type == "DELETED" or not contains(r.new, w)) then drifted[r.kind] = true end
  end
  if drifted.Namespace then drifted.ResourceQuota, drifted.LimitRange = true, true end
  for _, kind in ipairs(ORDER) do
    if drifted[kind] then
      ctx.logger.info("healing", kind)
      apply(ctx, kind)
    end
  end
  return { namespace = ctx.name }
end

luaop.on.create(PROJECTS, provision, { id = "provision" })
luaop.on.update(PROJECTS, provision, { id = "provision" })
luaop.on.resume(PROJECTS, provision, { id = "provision" })
luaop.on.related(PROJECTS, provision, {
  id = "provision",
  owned = { "v1/namespaces", "v1/resourcequotas", "v1/limitranges" },
})
