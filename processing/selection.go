package processing

import (
	"context"
	"log/slog"

	"k8s.io/client-go/tools/cache"

	"github.com/luaop/luaop/caching"
	"github.com/luaop/luaop/processing/causes"
)

// WatchFilters is the optional capability of Handlers to tell, per handler, the
// filters the API server can apply (static label filters, a value filter on
// metadata.namespace or metadata.name). The watch of a resource then asks the
// server only for the objects some handler may match: the union over its handlers
// (caching.Union), every object as soon as one handler has no such filter. Without
// it, every object is watched. It is called from a watcher's goroutine with specs of
// the current handler set, and must not block.
type WatchFilters interface {
	WatchFilter(spec causes.Spec) caching.HandlerFilter
}

// selectionOf is what the watch of resource asks the API server for, from the
// current handlers.
func (o *Reactor) selectionOf(r causes.Resource) caching.Selection {
	wf, ok := o.handlers.(WatchFilters)
	if !ok {
		return caching.Selection{}
	}
	specs := o.specs().byResource[r]
	filters := make([]caching.HandlerFilter, 0, len(specs))
	for _, s := range specs {
		filters = append(filters, wf.WatchFilter(s))
	}
	return caching.Union(filters)
}

// follow moves the watch to the views of the handlers' selection when a reload
// changed it: the new views are held and listed first (the old ones keep serving
// meanwhile), then the watcher leaves the old views for the new. Every object the
// new views hold comes again (as a change, never as the initial listing: the
// operator knows them, or they are new to it, as objects labelled after the start
// are); every object the operator holds that they do not is told as a DELETED event,
// which the worker finds to be a departure (departure.go): it left the selection.
func (w *watcher) follow(ctx context.Context, log *slog.Logger) {
	sel := w.op.selectionOf(w.resource)
	if cur := w.selection.Load(); cur != nil && *cur == sel {
		return
	}
	namespaces := w.namespaces(sel)
	if w.op.opts.Shard != nil {
		// The coordinator shares out what the handlers select now: the same
		// replica's label, other objects.
		w.op.opts.Shard.Watching(ctx, w.info.gvr, namespaces, sel)
	}
	held, err := w.hold(ctx, namespaces, sel)
	if err != nil {
		log.Error("cannot watch the handlers' new selection; the watch stays as it was", "error", err)
		return
	}
	synced := make([]cache.InformerSynced, 0, len(held))
	for _, hv := range held {
		synced = append(synced, hv.handle.Informer().HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		releaseViews(held)
		return
	}
	w.mu.Lock()
	old := w.held
	w.mu.Unlock()
	unregister(old)
	if err := w.register(held, false); err != nil {
		log.Error("cannot watch the handlers' new selection", "error", err)
	}
	releaseViews(old)
	log.Info("watching the handlers' new selection", watchAttrs(namespaces, sel, w.info.statusSubresource)...)
	w.tellDepartures(held)
}

// tellDepartures notifies a DELETED event for every object of the resource the
// operator holds that none of the held views holds.
func (w *watcher) tellDepartures(held []heldView) {
	for _, key := range w.op.objects.keys() {
		if key.resource != w.resource {
			continue
		}
		storeKey := key.name
		if key.namespace != "" {
			storeKey = key.namespace + "/" + key.name
		}
		inView := false
		for _, hv := range held {
			if _, found, _ := hv.handle.Informer().GetStore().GetByKey(storeKey); found {
				inView = true
				break
			}
		}
		if inView {
			continue
		}
		if st := w.op.objects.get(key); st != nil {
			if body := st.inbox.latest.Load(); body != nil {
				w.notify("DELETED", body, false)
			}
		}
	}
}
