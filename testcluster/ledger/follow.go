package ledger

import (
	"context"
	"fmt"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
)

// Follow lists the objects of client (with opts' selectors) and hands every one to
// fn as ADDED, then, in a goroutine, every version a watch from that list shows, until
// ctx ends; a watch that ends is resumed from the last version seen, one answered 410
// lists again (calling fn with each listed object as ADDED, then gap with the uids the
// list showed and its resourceVersion: what was deleted in between is not in it, and
// its DELETED event never comes; Ledger.Relisted). It returns once the first list is
// done, so that whatever is written afterwards is seen, and a function that waits for
// the goroutine to end after ctx did.
func Follow(ctx context.Context, client dynamic.ResourceInterface, opts metav1.ListOptions,
	fn func(eventType string, obj *unstructured.Unstructured), gap func(present map[string]bool, listRV int64)) (wait func(), err error) {
	rv, _, err := listInto(ctx, client, opts, fn)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			next, err := watchFrom(ctx, client, opts, rv, fn)
			switch {
			case err == nil:
				rv = next
			case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
				for ctx.Err() == nil {
					var present map[string]bool
					if rv, present, err = listInto(ctx, client, opts, fn); err == nil {
						if gap != nil {
							listRV, _ := strconv.ParseInt(rv, 10, 64)
							gap(present, listRV)
						}
						break
					}
					sleep(ctx, time.Second)
				}
			default:
				rv = next
				sleep(ctx, 200*time.Millisecond)
			}
		}
	}()
	return func() { <-done }, nil
}

func listInto(ctx context.Context, client dynamic.ResourceInterface, opts metav1.ListOptions, fn func(string, *unstructured.Unstructured)) (string, map[string]bool, error) {
	list, err := client.List(ctx, opts)
	if err != nil {
		return "", nil, fmt.Errorf("listing: %w", err)
	}
	present := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		present[string(list.Items[i].GetUID())] = true
		fn("ADDED", &list.Items[i])
	}
	return list.GetResourceVersion(), present, nil
}

// watchFrom watches from rv until the watch ends, and returns the last version seen.
func watchFrom(ctx context.Context, client dynamic.ResourceInterface, opts metav1.ListOptions, rv string, fn func(string, *unstructured.Unstructured)) (string, error) {
	opts.ResourceVersion = rv
	opts.AllowWatchBookmarks = true
	w, err := client.Watch(ctx, opts)
	if err != nil {
		return rv, err
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		switch ev.Type {
		case watch.Error:
			return rv, apierrors.FromObject(ev.Object)
		case watch.Bookmark:
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				rv = u.GetResourceVersion()
			}
		case watch.Added, watch.Modified, watch.Deleted:
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			rv = u.GetResourceVersion()
			fn(string(ev.Type), u)
		}
	}
	return rv, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
