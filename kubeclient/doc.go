// Package kubeclient is the Kubernetes client that Lua scripts use through luaop.kube:
// any resource by apiVersion and kind (resolved with a cached discovery REST mapper),
// objects as plain JSON maps, and Kubernetes Events (through the operator's shared,
// rate-limited recorder). It satisfies luabind.Kube. Reads are answered from the
// operator's informer cache (Client.Cache, a caching.Cache) for the resources it
// keeps, and from the API server otherwise or when asked (GetLive, ListLive: the
// scripts' {live = true}); every write is announced to the cache, whose reads then
// wait until they show it.
//
// It owns the discovery cache and REST mapper of the scripts' calls, and nothing of
// an object's processing. It may call eventing (the Events), caching (the reads it
// answers) and state (pure data rules); it must not import luabind (it satisfies luabind.Kube by its method set,
// the interface being the consumer's), processing or operator, which assemble it.
package kubeclient
