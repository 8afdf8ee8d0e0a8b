-- kopf's examples/11-filtering-handlers: handlers that run only for some objects:
-- by labels, annotations, a field's value or presence, a function, and (updates) a
-- field's old and new values.
local luaop = require("luaop")
local resource = "kopf.dev/v1/kopfexamples"

local function say_yes(value, ctx)
  return value == "somevalue" and ctx.spec.field ~= nil
end

local function say_no(value, ctx)
  return value == "somevalue" and ctx.spec.field == "not-this-value-for-sure"
end

local function log(message)
  return function(ctx) ctx.logger.info(message) end
end

luaop.on.create(resource, log("Label is matching."), { id = "create_with_labels_matching", labels = { somelabel = "somevalue" } })
luaop.on.create(resource, log("Label is present."), { id = "create_with_labels_present", labels = { somelabel = luaop.PRESENT } })
luaop.on.create(resource, log("Label is absent."), { id = "create_with_labels_absent", labels = { nonexistent = luaop.ABSENT } })
luaop.on.create(resource, log("Label callback matching."), { id = "create_with_labels_callback_matching", labels = { somelabel = say_yes } })
luaop.on.create(resource, log("Annotation is matching."), { id = "create_with_annotations_matching", annotations = { someannotation = "somevalue" } })
luaop.on.create(resource, log("Annotation is present."), { id = "create_with_annotations_present", annotations = { someannotation = luaop.PRESENT } })
luaop.on.create(resource, log("Annotation is absent."), { id = "create_with_annotations_absent", annotations = { nonexistent = luaop.ABSENT } })
luaop.on.create(resource, log("Annotation callback mismatch."), { id = "create_with_annotations_callback_matching", annotations = { someannotation = say_no } })
luaop.on.create(resource, log("Filter satisfied."), { id = "create_with_filter_satisfied", when = function(ctx) return true end })
luaop.on.create(resource, log("Filter not satisfied."), { id = "create_with_filter_not_satisfied", when = function(ctx) return false end })
luaop.on.create(resource, log("Field value is satisfied."), { id = "create_with_field_value_satisfied", field = "spec.field", value = "value" })
luaop.on.create(resource, log("Field value is not satisfied."), { id = "create_with_field_value_not_satisfied", field = "spec.field", value = "something-else" })
luaop.on.create(resource, log("Field presence is satisfied."), { id = "create_with_field_presence_satisfied", field = "spec.field", value = luaop.PRESENT })
luaop.on.create(resource, log("Field presence is not satisfied."), { id = "create_with_field_presence_not_satisfied", field = "spec.inexistent", value = luaop.PRESENT })

luaop.on.update(resource, log("Field change is satisfied."), { id = "update_with_field_change_satisfied",
  field = "spec.field", old = "value", new = "changed" })

luaop.daemon(resource, function(ctx)
  while not ctx.stopped() do
    ctx.logger.info("Field daemon is satisfied.")
    luaop.sleep(1)
  end
end, { id = "daemon_with_field", field = "spec.field", value = "value" })
