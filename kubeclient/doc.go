// Package kubeclient is the Kubernetes client that Lua scripts use through luaop.kube:
// any resource by apiVersion and kind (resolved with a cached discovery REST mapper),
// objects as plain JSON maps, and Kubernetes Events (through the operator's shared,
// rate-limited recorder). It satisfies luabind.Kube.
//
// It owns the discovery cache and REST mapper of the scripts' calls, and nothing of
// an object's processing. It may call eventing (the Events) and state (pure data
// rules); it must not import luabind (it satisfies luabind.Kube by its method set,
// the interface being the consumer's), processing or operator, which assemble it.
package kubeclient
