package processing

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/luaop/luaop/caching"
)

// freshnessFloor is what a consistent read of a resource (a list without a
// resourceVersion, which kube-apiserver answers from etcd's quorum, or from a watch
// cache it proved current) showed when its watcher started, before its informers
// listed. The informers' first list and watch may come from an older state than
// what this operator, or the replica before it, already handled: a lagging watch
// cache, a second API server that is behind (a list with resourceVersion=0, which
// client-go's informers send when the server does not stream lists, may be answered
// from either), or a watch that replays history from an old resourceVersion. A body
// no newer than the floor must then be the version the floor saw: an older one, or
// one of an incarnation that was gone by then, is stale, and is read again from the
// server before any handler runs on it (cycle.readAfterUnknownWrite), as after a
// write without answer. Sieve (OSDI'22) calls this fault "time travel".
//
// Built once by the watcher before its informers start, then read by workers: its
// leaf lock guards the entries, which go as the watch brings each key past them.
type freshnessFloor struct {
	mu sync.Mutex
	// versions are the lists' resourceVersions, per namespace listed ("" for all).
	versions map[string]string
	// objects are the incarnation and version of each object the lists showed.
	objects map[objectKey]floorEntry
}

type floorEntry struct{ uid, version string }

// stale tells whether body, the newest the watch delivered for key, is older than the
// consistent read. A body newer than the read, or the version it saw, is fresh, and
// the key's entry is dropped (the watch is past it).
func (f *freshnessFloor) stale(key objectKey, body *unstructured.Unstructured) bool {
	if f == nil {
		return false
	}
	rv := body.GetResourceVersion()
	f.mu.Lock()
	defer f.mu.Unlock()
	listed, ok := f.versions[key.namespace]
	if !ok {
		listed, ok = f.versions[""]
	}
	if !ok || versionNewer(rv, listed) {
		delete(f.objects, key)
		return false
	}
	e, found := f.objects[key]
	if !found || e.uid != string(body.GetUID()) || versionOlder(rv, e.version) {
		// Gone by the time of the read, another incarnation by then, or an older
		// version of this one.
		return true
	}
	delete(f.objects, key)
	return false
}

// loadFreshnessFloor reads the objects of the watcher's namespaces with consistent
// lists (pages of 500), keeping only their incarnation and version. A failure is
// retried a few times; past them the watcher starts without a floor (the informers
// would meet the same failure, and report it), which it logs.
// The lists select as the watch will (its label and field selectors), so that the
// floor keeps nothing of the objects the watch never delivers.
func (w *watcher) loadFreshnessFloor(ctx context.Context, log *slog.Logger, namespaces []string, sel caching.Selection) *freshnessFloor {
	f := &freshnessFloor{versions: map[string]string{}, objects: map[objectKey]floorEntry{}}
	for _, ns := range namespaces {
		var err error
		for attempt := 0; attempt < 3 && ctx.Err() == nil; attempt++ {
			if err = w.listFloor(ctx, f, ns, sel); err == nil || apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
				break
			}
			select {
			case <-ctx.Done():
			case <-w.op.clock.After(time.Duration(attempt+1) * 500 * time.Millisecond):
			}
		}
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil
		case apierrors.IsForbidden(err) || apierrors.IsNotFound(err):
			// The informers meet it too, and say so.
			log.Debug("cannot read the resource consistently at start; its first list is trusted as it comes", "namespace", ns, "error", err)
			return nil
		default:
			log.Warn("cannot read the resource consistently at start; its first list is trusted as it comes", "namespace", ns, "error", err)
			return nil
		}
	}
	return f
}

func (w *watcher) listFloor(ctx context.Context, f *freshnessFloor, ns string, sel caching.Selection) error {
	entries := map[objectKey]floorEntry{}
	version, cont := "", ""
	for {
		opts := metav1.ListOptions{Limit: 500, Continue: cont, LabelSelector: sel.Labels, FieldSelector: sel.FieldSelector()}
		var items []metav1.ObjectMeta
		var next, rv string
		if w.op.metadata != nil {
			list, err := w.op.metadata.Resource(w.info.gvr).Namespace(ns).List(ctx, opts)
			if err != nil {
				return err
			}
			for i := range list.Items {
				items = append(items, list.Items[i].ObjectMeta)
			}
			next, rv = list.GetContinue(), list.GetResourceVersion()
		} else {
			list, err := w.op.dynamic.Resource(w.info.gvr).Namespace(ns).List(ctx, opts)
			if err != nil {
				return err
			}
			for i := range list.Items {
				items = append(items, metav1.ObjectMeta{Namespace: list.Items[i].GetNamespace(), Name: list.Items[i].GetName(),
					UID: list.Items[i].GetUID(), ResourceVersion: list.Items[i].GetResourceVersion()})
			}
			next, rv = list.GetContinue(), list.GetResourceVersion()
		}
		if version == "" {
			version = rv // the pages after the first are of the same snapshot
		}
		for _, m := range items {
			if m.Namespace != "" && !w.op.filter.allows(m.Namespace) {
				continue
			}
			entries[objectKey{resource: w.resource, namespace: m.Namespace, name: m.Name}] = floorEntry{uid: string(m.UID), version: m.ResourceVersion}
		}
		if next == "" {
			break
		}
		cont = next
	}
	if version == "" {
		return errors.New("the list has no resourceVersion")
	}
	f.versions[ns] = version
	for k, e := range entries {
		f.objects[k] = e
	}
	return nil
}
