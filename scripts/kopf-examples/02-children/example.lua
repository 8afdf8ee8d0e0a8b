-- kopf's examples/02-children: a Pod per object, made its child (owner reference,
-- namespace, generated name, labels: luaop.adopt), deleted with it by Kubernetes.
local luaop = require("luaop")

luaop.on.create("kopf.dev/v1/kopfexamples", function(ctx)
  -- Render the pod yaml with some spec fields used in the template.
  local doc = luaop.yaml.decode(string.format([[
apiVersion: v1
kind: Pod
spec:
  containers:
  - name: the-only-one
    image: busybox
    command: ["sh", "-x", "-c"]
    args:
    - |
      echo "FIELD=$FIELD"
      sleep %s
    env:
    - name: FIELD
      value: %s
]], ctx.spec.duration or 0, ctx.spec.field or "default-value"))

  -- Make it our child: assign the namespace, name, labels, owner references, etc.
  luaop.adopt(doc)

  -- Actually create an object by requesting the Kubernetes API.
  local pod, err = luaop.kube.create(doc)
  if pod == nil then
    error("creating the pod: " .. err) -- retried after the backoff
  end

  -- Update the parent's status.
  return { children = { pod.metadata.uid } }
end, { id = "create_fn" })
