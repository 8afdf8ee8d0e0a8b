package sharding

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/state"
)

// This file is the replica's side: the processing.Shard that narrows the watches
// and refuses what is being handed over, and the handovers themselves.

// drainItem is one object to hand over: to target (the handover annotation's
// member), or, for a filtered resource, only to release.
type drainItem struct {
	ref      objRef
	target   string
	filtered bool
}

// Watching decides how resource is split (processing.Shard), and what of it: the
// objects the handlers' selection holds (a label filter watches only those; the
// coordinator must not label, count and plan the others). By the shard label
// when this replica may patch its objects in every watched namespace (the
// coordinator writes the label, this replica the handovers), else filtered after
// the watch, said in the log.
func (s *Sharding) Watching(ctx context.Context, gvr schema.GroupVersionResource, namespaces []string, selection caching.Selection) string {
	filtered := false
	for _, ns := range namespaces {
		ok, err := s.mayPatch(ctx, gvr, ns)
		if err != nil {
			s.log.Warn("cannot tell whether luaop may label this resource's objects; filtering them after the watch", "resource", gvr.String(), "error", err)
			filtered = true
			break
		}
		if !ok {
			s.log.Warn("luaop may not patch this resource's objects (no RBAC right), so they cannot carry the shard label: "+
				"every replica watches all of them and handles its share by hash (no handover handshake: a move may overlap a cycle); grant patch to shard by label",
				"resource", gvr.String(), "namespace", ns)
			filtered = true
			break
		}
	}
	s.mu.Lock()
	s.resources[gvr] = &resourceShare{gvr: gvr, namespaces: namespaces, labels: selection.Labels, fields: selection.FieldSelector(), filtered: filtered}
	s.mu.Unlock()
	poke(s.resourcesChanged)
	poke(s.coordinatorWake)
	if filtered {
		return ""
	}
	return s.Selector()
}

func (s *Sharding) mayPatch(ctx context.Context, gvr schema.GroupVersionResource, ns string) (bool, error) {
	review, err := s.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: ns, Verb: "patch", Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, err
	}
	return review.Status.Allowed, nil
}

// Admits is processing.Shard's filter. Label-selected resources: the watch holds
// only this replica's objects; one marked for handover (or being handed over) is
// refused from that notification on, until it has left the watch (the watch's
// DELETED when its label moved, also refused). Filtered resources: what the ring
// gives this replica.
func (s *Sharding) Admits(gvr schema.GroupVersionResource, eventType string, obj *unstructured.Unstructured) bool {
	ref := objRef{gvr: gvr, namespace: obj.GetNamespace(), name: obj.GetName()}
	deleted := eventType == "DELETED"
	var queue *drainItem
	s.mu.Lock()
	share := s.resources[gvr]
	admit := true
	switch _, draining := s.draining[ref]; {
	case share == nil:
	case draining:
		if deleted {
			delete(s.draining, ref)
		}
		admit = false
	case deleted:
		_, had := s.owned[ref]
		delete(s.owned, ref)
		admit = had || !share.filtered
	case share.filtered:
		if s.ring.Owner(ref.key()) == s.member {
			s.owned[ref] = struct{}{}
		} else {
			admit = false
			if _, had := s.owned[ref]; had {
				delete(s.owned, ref)
				s.draining[ref] = struct{}{}
				queue = &drainItem{ref: ref, filtered: true}
			}
		}
	default:
		if target := obj.GetAnnotations()[s.handover]; target != "" && target != s.member {
			delete(s.owned, ref)
			s.draining[ref] = struct{}{}
			queue = &drainItem{ref: ref, target: target}
			admit = false
		} else {
			s.owned[ref] = struct{}{}
		}
	}
	owned, members := len(s.owned), len(s.members)
	s.mu.Unlock()
	if queue != nil {
		s.drains.Add(*queue)
	}
	if s.opts.Observer != nil {
		s.opts.Observer.ShardOwned(owned, members)
	}
	return admit
}

// handOverNext hands one object over: the Reactor releases it (its cycle in
// flight done, daemons and timers stopped), then, for a label-selected resource,
// one write moves the label to the target and removes the handover annotation,
// on condition that the annotation still names that target. Only that write lets
// the new owner see the object.
func (s *Sharding) handOverNext(ctx context.Context) bool {
	item, shutdown := s.drains.Get()
	if shutdown {
		return false
	}
	defer s.drains.Done(item)
	ref := item.ref
	if rel := s.releaser(); rel != nil {
		if err := rel.Release(ctx, ref.gvr, ref.namespace, ref.name); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("could not release an object for its handover; retrying", "object", ref.String(), "error", err)
				s.drains.AddRateLimited(item)
			}
			return true
		}
	}
	if item.filtered {
		s.mu.Lock()
		delete(s.draining, ref)
		s.mu.Unlock()
		s.drains.Forget(item)
		s.handedOver(ref, "")
		return true
	}
	patch, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/annotations/" + state.EscapePointerToken(s.handover), "value": item.target},
		{"op": "add", "path": "/metadata/labels/" + state.EscapePointerToken(s.label), "value": item.target},
		{"op": "remove", "path": "/metadata/annotations/" + state.EscapePointerToken(s.handover)},
	})
	_, err := s.meta.Resource(ref.gvr).Namespace(ref.namespace).Patch(ctx, ref.name, types.JSONPatchType, patch, metav1.PatchOptions{})
	switch {
	case err == nil:
		s.drains.Forget(item)
		s.handedOver(ref, item.target)
	case apierrors.IsNotFound(err):
		s.drains.Forget(item)
		s.mu.Lock()
		delete(s.draining, ref)
		s.mu.Unlock()
	case apierrors.IsInvalid(err) || statusCode(err) == 422:
		// The annotation no longer names target: the coordinator gave the object
		// to someone else meanwhile (it judged this replica gone). If it is still
		// labelled for this replica, take it back.
		s.drains.Forget(item)
		s.takeBackIfMine(ctx, ref)
	default:
		if ctx.Err() == nil {
			s.log.Warn("could not hand an object over; retrying", "object", ref.String(), "to", item.target, "error", err)
			s.drains.AddRateLimited(item)
		}
	}
	return true
}

func (s *Sharding) handedOver(ref objRef, target string) {
	s.released.Add(1)
	if target != "" {
		s.log.Debug("handed over", "object", ref.String(), "to", target)
	}
	if s.opts.Observer != nil {
		s.opts.Observer.ShardHandover("released")
	}
}

func (s *Sharding) takeBackIfMine(ctx context.Context, ref objRef) {
	obj, err := s.meta.Resource(ref.gvr).Namespace(ref.namespace).Get(ctx, ref.name, metav1.GetOptions{})
	if err != nil || obj.Labels[s.label] != s.member || obj.Annotations[s.handover] != "" {
		return // gone, or someone else's now: its watch event ends the draining
	}
	s.mu.Lock()
	delete(s.draining, ref)
	s.mu.Unlock()
	if rel := s.releaser(); rel != nil {
		rel.Revisit(ref.gvr)
	}
}

// followMembers keeps the replica's view of the members (State, the ring of the
// filtered resources) and, for those resources, releases what the ring no longer
// gives this replica and offers the watch's objects again for what it now gives.
func (s *Sharding) followMembers(ctx context.Context) {
	for {
		members, next := s.ms.live(s.clock.Now())
		s.mu.Lock()
		changed := !equalStrings(members, s.members)
		var release []drainItem
		var revisit []schema.GroupVersionResource
		if changed {
			s.members = members
			s.ring = NewRing(members, s.opts.VirtualNodes)
			for ref := range s.owned {
				if share := s.resources[ref.gvr]; share != nil && share.filtered && s.ring.Owner(ref.key()) != s.member {
					delete(s.owned, ref)
					s.draining[ref] = struct{}{}
					release = append(release, drainItem{ref: ref, filtered: true})
				}
			}
			for _, r := range s.resources {
				if r.filtered {
					revisit = append(revisit, r.gvr)
				}
			}
		}
		owned := len(s.owned)
		s.mu.Unlock()
		if changed {
			s.log.Info("shard members", "members", strings.Join(members, ","))
			if s.opts.Observer != nil {
				s.opts.Observer.ShardOwned(owned, len(members))
			}
			for _, it := range release {
				s.drains.Add(it)
			}
			if rel := s.releaser(); rel != nil {
				for _, gvr := range revisit {
					rel.Revisit(gvr)
				}
			}
		}
		var expiry <-chan time.Time
		if !next.IsZero() {
			expiry = s.clock.After(next.Sub(s.clock.Now()) + time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.membersChanged:
		case <-s.resourcesChanged:
			// A filtered resource registered after the members were known.
			s.mu.Lock()
			s.members = nil
			s.mu.Unlock()
		case <-expiry:
		}
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func statusCode(err error) int32 {
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		return st.Status().Code
	}
	return 0
}
