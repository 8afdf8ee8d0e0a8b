-- Object helpers of the luaop module (kopf's adopt, append_owner_reference, label).
local luaop, current_body = ...

local function metadata(obj)
  if obj.metadata == nil then obj.metadata = {} end
  return obj.metadata
end

-- owner_reference(owner) returns an ownerReference to owner (controller, blocking
-- the owner's deletion until the dependent is gone).
function luaop.owner_reference(owner, opts)
  opts = opts or {}
  local m = owner.metadata
  local controller, block = true, true
  if opts.controller ~= nil then controller = opts.controller end
  if opts.block_owner_deletion ~= nil then block = opts.block_owner_deletion end
  return { apiVersion = owner.apiVersion, kind = owner.kind, name = m.name, uid = m.uid,
           controller = controller, blockOwnerDeletion = block }
end

function luaop.append_owner_reference(obj, owner, opts)
  owner = owner or current_body()
  local m = metadata(obj)
  local ref = luaop.owner_reference(owner, opts)
  local refs = luaop.array()
  for _, r in ipairs(m.ownerReferences or {}) do
    if r.uid == ref.uid then return obj end
    table.insert(refs, r)
  end
  table.insert(refs, ref)
  m.ownerReferences = refs
  return obj
end

function luaop.remove_owner_reference(obj, owner)
  owner = owner or current_body()
  local m = metadata(obj)
  local refs = luaop.array()
  for _, r in ipairs(m.ownerReferences or {}) do
    if r.uid ~= owner.metadata.uid then table.insert(refs, r) end
  end
  m.ownerReferences = refs
  return obj
end

function luaop.label(obj, labels)
  local m = metadata(obj)
  if m.labels == nil then m.labels = {} end
  for k, v in pairs(labels) do m.labels[k] = v end
  return obj
end

-- adopt(obj[, owner]) makes obj a dependent of owner (by default the object being
-- handled): owner reference, same namespace, a generated name when it has none, and
-- the owner's labels (kopf's adopt; labels the child already has win).
-- Kubernetes then deletes obj when its owner is deleted.
function luaop.adopt(obj, owner, opts)
  owner = owner or current_body()
  if owner == nil then error("luaop.adopt: no owner given and no object is being handled", 2) end
  luaop.append_owner_reference(obj, owner, opts)
  local m = metadata(obj)
  if m.namespace == nil and owner.metadata.namespace ~= nil then
    m.namespace = owner.metadata.namespace
  end
  if m.name == nil and m.generateName == nil then
    m.generateName = owner.metadata.name .. "-"
  end
  local owner_labels = owner.metadata.labels
  if owner_labels ~= nil then
    for k, v in pairs(owner_labels) do
      if m.labels == nil then m.labels = {} end
      if m.labels[k] == nil then m.labels[k] = v end
    end
  end
  return obj
end
