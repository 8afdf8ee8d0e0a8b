package main

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/admission"
)

// luaop dev applies objects, adds finalizers in every namespace it serves and
// registers webhooks: on a shared cluster it could hurt others. So it names the
// cluster before doing anything, and refuses a cluster that is not a local one
// unless the user named or allowed its context (Tilt's allow_k8s_contexts).

// localContexts are the kubeconfig context names local clusters are given by their
// tools (kind-<name>, k3d-<name>, minikube, Docker Desktop, Rancher Desktop,
// OrbStack, colima).
var localContexts = []string{"kind-*", "k3d-*", "minikube", "docker-desktop", "docker-for-desktop", "rancher-desktop", "orbstack", "colima", "colima-*"}

// clusterTarget is the cluster a command is about to use.
type clusterTarget struct {
	// Context is the kubeconfig context ("" in a pod, with no kubeconfig).
	Context string
	// Server is the API server's URL.
	Server string
	// OnThisMachine: the server's address is loopback or this machine's.
	OnThisMachine bool
}

func (c clusterTarget) String() string {
	if c.Context == "" {
		return "server " + c.Server + " (no kubeconfig context: in-cluster configuration)"
	}
	return fmt.Sprintf("context %q, server %s", c.Context, c.Server)
}

// isLocalCluster tells whether the target is a local cluster: a context named as
// local cluster tools name theirs, or a server on this machine.
func isLocalCluster(c clusterTarget) bool {
	if c.OnThisMachine {
		return true
	}
	for _, pattern := range localContexts {
		if ok, _ := path.Match(pattern, c.Context); ok {
			return true
		}
	}
	return false
}

// devAllowed is the rule of luaop dev: a local cluster, a context named with
// --context (explicitly: not the kubeconfig's current one), or one listed in
// --allow-context. The error says what to do.
func devAllowed(c clusterTarget, explicitContext string, allowed []string) error {
	if isLocalCluster(c) || (explicitContext != "" && explicitContext == c.Context) || (c.Context != "" && slices.Contains(allowed, c.Context)) {
		return nil
	}
	name := c.Context
	if name == "" {
		name = "NAME"
	}
	return fmt.Errorf("luaop dev: the cluster of %s is not a local one (%s, or a server on this machine); "+
		"luaop dev applies objects, adds finalizers and registers webhooks in the cluster it serves, so it does not use a shared cluster unless told: "+
		"name it with --context %s, or allow it with --allow-context %s (repeatable; allow-context in the config file)",
		c, strings.Join(localContexts, ", "), name, name)
}

// targetOf describes the cluster of a settings' kubeconfig and rest.Config.
func targetOf(s settings, cfg *rest.Config) clusterTarget {
	t := clusterTarget{Context: s.Context, Server: cfg.Host, OnThisMachine: admission.ServerOnThisMachine(cfg)}
	if t.Context == "" {
		if raw, err := clientConfig(s).RawConfig(); err == nil {
			t.Context = raw.CurrentContext
		}
	}
	return t
}
