package main

import (
	"log/slog"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/luabind"
)

func luabindOptions(s settings, log *slog.Logger) luabind.Options {
	return luabind.Options{Shards: s.Shards, HandlerTimeout: s.HandlerTimeout, Logger: log, LogEvents: s.LogEvents, MemoryBudget: s.LuaMemoryBudget}
}

// withCodec gives a config the defaults an unversioned REST client needs.
func withCodec(c *rest.Config) *rest.Config {
	c.GroupVersion = &schema.GroupVersion{}
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return c
}
