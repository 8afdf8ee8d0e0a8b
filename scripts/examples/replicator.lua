-- A ConfigMap replicator, with no timer, no daemon and no LIST per event.
--
-- A ConfigMap labelled luaop.dev/replicate=true (a source, in any namespace) is
-- copied under its own name into every namespace labelled luaop.dev/replica=true;
-- each copy is labelled luaop.dev/replica-of=<namespace>.<name>. Copies are healed:
-- a hand edit is reverted, a deleted copy re-created; a change of the source
-- reaches every copy; a namespace newly labelled gets every copy; deleting the
-- source deletes its copies (a finalizer holds it meanwhile).
--
-- Owner references cannot cross namespaces, so a copy names its source with a
-- label (a labelled relation), and namespaces map to the sources through an index
-- (a mapped relation). One function serves the source's own causes (create,
-- update, resume) and its related objects' changes, as one controller-runtime
-- Reconcile: ctx.reason says which, ctx.related what changed.
local luaop = require("luaop")

local CONFIGMAPS = "v1/configmaps"
local SOURCE = "luaop.dev/replicate"     -- on a source ConfigMap: "true"
local REPLICA = "luaop.dev/replica"      -- on a namespace that receives copies: "true"
local REPLICA_OF = "luaop.dev/replica-of" -- on a copy: <namespace>.<name> of its source

local function labelled(obj, key)
  local meta = obj and obj.metadata
  local labels = meta and meta.labels
  return labels ~= nil and labels[key] == "true"
end

-- The namespaces that receive copies and the sources, kept from the watches by
-- the operator (no LIST per event): ctx.indexes.<id>.all.
luaop.index("v1/namespaces", function(ctx)
  if ctx.meta.deletionTimestamp then return nil end -- being deleted: no more copies there
  return { all = ctx.name }
end, { id = "replica_namespaces", labels = { [REPLICA] = "true" } })

luaop.index(CONFIGMAPS, function(ctx)
  return { all = ctx.namespace .. "/" .. ctx.name }
end, { id = "replicated_sources", labels = { [SOURCE] = "true" } })

-- The namespaces that should hold a copy of the source: the index, corrected by
-- the namespaces whose change brought this run (the index may not show it yet).
local function targets(ctx)
  local set = {}
  for _, ns in ipairs(ctx.indexes.replica_namespaces.all or {}) do set[ns] = true end
  for _, r in ipairs(ctx.related or {}) do
    if r.kind == "Namespace" then
      local ns = r.new
      set[r.name] = ns ~= nil and labelled(ns, REPLICA) and ns.metadata.deletionTimestamp == nil or nil
    end
  end
  set[ctx.namespace] = nil -- never over the source itself
  return set
end

local function sorted(set)
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list
end

local function data_of(obj)
  local out = {}
  for k, v in pairs(obj.data or {}) do out[k] = v end
  return out
end

local function copy_of(ctx, ns)
  return {
    apiVersion = "v1", kind = "ConfigMap",
    metadata = { name = ctx.name, namespace = ns, labels = { [REPLICA_OF] = ctx.namespace .. "." .. ctx.name } },
    data = luaop.object(data_of(ctx.body)),
  }
end

-- A namespace gone or being deleted takes its copies with it: nothing to do there.
local function gone(reason, err)
  return reason == "NotFound" or reason == "Forbidden" and tostring(err):find("being terminated", 1, true) ~= nil
end

local function check(what, ns, name, err, reason)
  if err and not gone(reason, err) then
    error(luaop.temporary_error(what .. " " .. ns .. "/" .. name .. ": " .. err, 1))
  end
end

-- Creates or updates a copy (server-side apply: fields the source dropped go too).
local function put(ctx, ns)
  local _, err, reason = luaop.kube.apply(copy_of(ctx, ns))
  check("copying to", ns, ctx.name, err, reason)
end

local function remove(ctx, ns)
  local _, err, reason = luaop.kube.delete("v1", "ConfigMap", ns, ctx.name)
  check("deleting the copy", ns, ctx.name, err, reason)
end

-- Makes a copy that drifted exactly the source again: a merge patch that also
-- nulls the keys added by hand (server-side apply would keep another writer's keys).
local function heal(ctx, copy)
  local want, have = data_of(ctx.body), data_of(copy)
  local patch, drifted = {}, false
  for k, v in pairs(want) do
    if have[k] ~= v then patch[k], drifted = v, true end
  end
  for k in pairs(have) do
    if want[k] == nil then patch[k], drifted = luaop.null, true end
  end
  local of = ctx.namespace .. "." .. ctx.name
  local labels = copy.metadata.labels
  if not drifted and labels ~= nil and labels[REPLICA_OF] == of then return end
  ctx.logger.info("healing the copy in", copy.metadata.namespace, "version", copy.metadata.resourceVersion)
  local _, err, reason = luaop.kube.patch("v1", "ConfigMap", copy.metadata.namespace, ctx.name,
    { metadata = { labels = { [REPLICA_OF] = of } }, data = luaop.object(patch) })
  check("healing", copy.metadata.namespace, ctx.name, err, reason)
end

local function replicate(ctx)
  local want = targets(ctx)
  if ctx.reason ~= "related" then
    -- The source itself: created, changed, or found at start. Every copy.
    for _, ns in ipairs(sorted(want)) do put(ctx, ns) end
    return
  end
  -- Only what changed: a copy edited, deleted or moved, a namespace (un)labelled.
  for _, r in ipairs(ctx.related) do
    if r.kind == "Namespace" then
      if want[r.name] then put(ctx, r.name) else remove(ctx, r.name) end
    elseif r.namespace ~= ctx.namespace then
      if not want[r.namespace] then
        if r.type ~= "DELETED" then remove(ctx, r.namespace) end
      elseif r.type == "DELETED" or not r.new.metadata.labels or r.new.metadata.labels[REPLICA_OF] ~= ctx.namespace .. "." .. ctx.name then
        put(ctx, r.namespace) -- deleted, or its label taken away (it left the watch)
      else
        heal(ctx, r.new)
      end
    end
  end
end

local SOURCES = { [SOURCE] = "true" }
luaop.on.create(CONFIGMAPS, replicate, { id = "replicate", labels = SOURCES })
luaop.on.update(CONFIGMAPS, replicate, { id = "replicate", labels = SOURCES })
luaop.on.resume(CONFIGMAPS, replicate, { id = "replicate", labels = SOURCES })
luaop.on.related(CONFIGMAPS, replicate, {
  id = "replicate",
  labels = SOURCES,
  -- A copy names its source in its label (only labelled ConfigMaps are watched).
  labelled = { [CONFIGMAPS] = REPLICA_OF },
  -- A namespace labelled (or no longer) concerns every source.
  mapped = { ["v1/namespaces"] = function(ctx)
    if not labelled(ctx.body, REPLICA) then return nil end
    return ctx.indexes.replicated_sources.all
  end },
})

luaop.on.delete(CONFIGMAPS, function(ctx)
  for _, ns in ipairs(sorted(targets(ctx))) do remove(ctx, ns) end
end, { id = "unreplicate", labels = SOURCES })
