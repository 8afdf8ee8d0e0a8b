package main

import (
	"context"
	"log/slog"
	"sync"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/admission"
	"github.com/luaop/luaop/devloop"
	"github.com/luaop/luaop/leader"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/metrics"
	"github.com/luaop/luaop/operator"
	"github.com/luaop/luaop/peering"
	"github.com/luaop/luaop/processing"
	"github.com/luaop/luaop/processing/causes"
)

// Peering as runOperator uses it: the operator starts paused, peering resumes it
// once no peer of a higher (or the same) priority serves the same resources, and
// pauses it again when one comes. What pauses is the operator's processing and the
// ownership of the webhook configurations (the webhook server keeps answering what
// is sent to it).

// podNamespace is the namespace of the Pod the process runs in, "" outside one.
func podNamespace() string {
	ns, _ := leader.PodNamespace()
	return ns
}

// peeringNamespace is --peering-namespace, else the pod's namespace, else
// peering.DefaultNamespace (deploy/'s).
func peeringNamespace(s settings) string {
	if s.PeeringNamespace != "" {
		return s.PeeringNamespace
	}
	if ns := podNamespace(); ns != "" {
		return ns
	}
	return peering.DefaultNamespace
}

// operatorWork is the peering.Worker of one operator.
type operatorWork struct {
	op       *operator.Operator
	webhooks *admission.Webhooks // nil without webhooks
}

// Pause stops the operator's work and its ownership of the webhook configurations
// at once, and returns once both have ended: the cycles in flight, the daemons, and
// a sync of the configurations under way (it would write over the peer's).
func (w operatorWork) Pause(ctx context.Context, reason string) error {
	if w.webhooks != nil {
		w.webhooks.SetActive(false)
	}
	if err := w.op.Pause(ctx, reason); err != nil {
		return err
	}
	if w.webhooks != nil {
		return w.webhooks.WaitIdle(ctx)
	}
	return nil
}

func (w operatorWork) Resume() {
	w.op.Resume()
	if w.webhooks != nil {
		w.webhooks.SetActive(true)
	}
}

// scopeResolver turns the handlers' resources into peering's Scope: resolved
// through discovery to the names processing uses (a resource two operators spell
// differently is still the same), as spelt when discovery cannot resolve it.
type scopeResolver struct {
	disco      discovery.DiscoveryInterface
	namespaces []string
}

func (r scopeResolver) scope(rt *luabind.Runtime) peering.Scope {
	seen := map[causes.Resource]bool{}
	var resources []string
	for _, spec := range rt.Specs() {
		if spec.Resource.Resource == "" || seen[spec.Resource] {
			continue
		}
		seen[spec.Resource] = true
		name := processing.ControllerName(spec.Resource)
		if rr, err := processing.ResolveResource(r.disco, spec.Resource); err == nil {
			name = processing.ControllerName(causes.Resource{GroupVersionResource: rr.GVR})
		}
		resources = append(resources, name)
	}
	return peering.Scope{Resources: resources, Namespaces: r.namespaces}
}

// peerScope makes peering's scope follow the handlers the runtime serves
// (reloading.Follower).
type peerScope struct {
	peer   *peering.Peering
	scopes *scopeResolver
	rt     *luabind.Runtime
}

func (p peerScope) Resync() { p.peer.SetScope(p.scopes.scope(p.rt)) }

// newPeering prepares peering for the operator, or nil with --standalone or
// --dry-run (a dry run writes nothing, its Lease neither). The dev view and the
// metrics are told about every change.
func newPeering(cfg *rest.Config, s settings, dev bool, op *operator.Operator, webhooks *admission.Webhooks,
	m *metrics.Metrics, view *devloop.View, log *slog.Logger) (*peering.Peering, *scopeResolver, error) {
	if s.Standalone {
		log.Info("peering off (--standalone): this operator does not coordinate with others of prefix " + s.Prefix)
		return nil, nil, nil
	}
	if s.DryRun {
		log.Info("dry run: no peering (a dry run writes no Lease)")
		return nil, nil, nil
	}
	client, err := kubernetes.NewForConfig(rest.AddUserAgent(rest.CopyConfig(cfg), "peering"))
	if err != nil {
		return nil, nil, err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	resolver := &scopeResolver{disco: disco, namespaces: s.Namespaces}
	mode := "run"
	if dev {
		mode = "dev"
	}
	var mu sync.Mutex
	paused := false // shown as paused in the view (a real pause, not the first look)
	p, err := peering.New(client, operatorWork{op: op, webhooks: webhooks}, resolver.scope(op.Runtime()), peering.Options{
		Namespace: peeringNamespace(s), Prefix: s.Prefix, Mode: mode, Priority: s.Priority,
		LeaseDuration: s.PeeringLeaseDuration, Logger: log,
		OnChange: func(st peering.State) {
			m.Peering(st.Paused, len(st.Peers))
			if view == nil {
				return
			}
			mu.Lock()
			note, ok := peeringNote(st, paused)
			if note != "" {
				paused = !ok
			}
			mu.Unlock()
			if note != "" {
				view.Note(ok, note)
			}
		},
	})
	if err != nil {
		return nil, nil, err
	}
	return p, resolver, nil
}

// peeringNote is the dev view's line about a change of peering's state (the
// log says more), and whether it is fine: a pause, loudly; the end of one.
func peeringNote(st peering.State, wasPaused bool) (string, bool) {
	switch {
	case st.Paused && st.Reason == "looking for peers":
		return "", true
	case st.Paused:
		return "peering: " + st.Reason + ": this session handles nothing meanwhile (--standalone turns peering off)", false
	case wasPaused:
		return "peering: working again", true
	}
	return "", true
}

// runPeered runs the operator's work under peering: paused at first, peering
// deciding; when the work ends, the webhook configurations go first (a peer
// resuming writes its own), then the Lease (peers resume at once).
func runPeered(ctx context.Context, op *operator.Operator, p *peering.Peering, stopWebhooks func()) error {
	if p == nil {
		err := op.Start(ctx)
		stopWebhooks()
		return err
	}
	_ = op.Pause(ctx, "looking for peers") // before Start: returns at once
	peerCtx, stopPeering := context.WithCancel(context.WithoutCancel(ctx))
	peered := make(chan struct{})
	go func() {
		defer close(peered)
		_ = p.Run(peerCtx)
	}()
	err := op.Start(ctx)
	stopWebhooks()
	stopPeering()
	<-peered
	return err
}
