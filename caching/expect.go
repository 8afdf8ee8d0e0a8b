package caching

import (
	"context"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

// Read-your-own-writes. A write the operator made (Wrote) is remembered per view as
// an expectation of what the view must show: the written version (or newer) when
// the written object is one the view selects, its absence (or a newer version)
// when it is not, and for a deletion the absence of that incarnation or its
// deletion in progress. A read of the view first waits, up to
// Options.ReadYourWritesTimeout, for the expectations it concerns (the object for a
// Get, the list's namespace for a List): the informer's own notifications settle
// them, as the processing core's consistency wait settles its own patches (kopf's
// "consistency after its own patch"). What the view held before is then never
// served after the write returned, whoever reads.

// want is what a view must show after a write.
type want int

const (
	wantVersion want = iota // the object at the written version, or newer
	wantAbsent              // not the object, or a newer version of it (it left the view)
	wantGone                // not incarnation uid, or that incarnation being deleted
)

type expectation struct {
	want      want
	version   string
	uid       string
	namespace string
	deadline  time.Time
	// done is closed when the expectation leaves its view's map (met, replaced by a
	// newer write of the same object, or expired): its waiters look again.
	done chan struct{}
}

// met tells whether stored (nil: nothing stored) shows the write.
func (e *expectation) met(stored any) bool {
	if stored == nil {
		return e.want != wantVersion
	}
	m, err := meta.Accessor(stored)
	if err != nil {
		return true
	}
	switch e.want {
	case wantGone:
		return string(m.GetUID()) != e.uid || m.GetDeletionTimestamp() != nil
	default:
		return !VersionOlder(m.GetResourceVersion(), e.version)
	}
}

// Wrote tells the cache about a write through the scripts' client: written is what
// the API server answered (nil for a deletion). Reads of the views of the object
// wait until they show it (see above).
func (c *Cache) Wrote(resource schema.GroupVersionResource, namespace, name string, written map[string]any) {
	c.mu.Lock()
	var views []*view
	for _, v := range c.views {
		if v.key.Resource == resource && (v.key.Namespace == "" || v.key.Namespace == namespace) {
			views = append(views, v)
		}
	}
	c.mu.Unlock()
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	deadline := c.opts.Clock.Now().Add(c.opts.ReadYourWritesTimeout)
	for _, v := range views {
		e := &expectation{namespace: namespace, deadline: deadline, done: make(chan struct{})}
		if written == nil {
			stored, found, _ := v.informer.GetIndexer().GetByKey(key)
			if !found {
				continue // nothing to wait for
			}
			m, err := meta.Accessor(stored)
			if err != nil {
				continue
			}
			e.want, e.uid = wantGone, string(m.GetUID())
		} else {
			u := &unstructured.Unstructured{Object: written}
			e.version = u.GetResourceVersion()
			if !v.selects(u) {
				e.want = wantAbsent
			}
		}
		v.expectWrite(key, e, c.opts.Clock.Now())
	}
}

// fieldsOf are the fields of obj a field selector of a view may test.
func fieldsOf(obj metav1.Object) fields.Set {
	return fields.Set{"metadata.name": obj.GetName(), "metadata.namespace": obj.GetNamespace()}
}

// selects tells whether the view's selectors select obj.
func (v *view) selects(obj metav1.Object) bool {
	if !v.labels.Matches(labels.Set(obj.GetLabels())) {
		return false
	}
	return v.fields == nil || v.fields.Matches(fieldsOf(obj))
}

// expectWrite records e for key, replacing (and releasing the waiters of) an older
// write's; it is settled at once when the store shows it already. It is recorded
// before the store is read: a notification after the record settles it, one before
// is in the store.
func (v *view) expectWrite(key string, e *expectation, now time.Time) {
	v.mu.Lock()
	old := v.expect[key]
	v.expect[key] = e
	crowded := len(v.expect) > 256
	v.mu.Unlock()
	if old != nil {
		close(old.done)
	}
	if e.met(v.stored(key)) {
		v.settle(key, e)
	}
	if crowded {
		v.sweep(now)
	}
}

func (v *view) stored(key string) any {
	obj, found, _ := v.informer.GetIndexer().GetByKey(key)
	if !found {
		return nil
	}
	return obj
}

// settle removes e if it is still key's expectation, and releases its waiters.
func (v *view) settle(key string, e *expectation) {
	v.mu.Lock()
	mine := v.expect[key] == e
	if mine {
		delete(v.expect, key)
	}
	v.mu.Unlock()
	if mine {
		close(e.done)
	}
}

// sweep drops the expectations past their deadline at now (a watch that lags
// leaves them; reads drop the ones they meet, this the others).
func (v *view) sweep(now time.Time) {
	v.mu.Lock()
	var expired []*expectation
	for k, e := range v.expect {
		if !now.Before(e.deadline) {
			delete(v.expect, k)
			expired = append(expired, e)
		}
	}
	v.mu.Unlock()
	for _, e := range expired {
		close(e.done)
	}
}

// awaitWrites waits until the view shows every write announced to it that match
// selects, each up to its deadline, or ctx ends. A write the view does not show by
// its deadline is dropped, and the read answers what the view holds.
func (c *Cache) awaitWrites(ctx context.Context, v *view, match func(key string, e *expectation) bool) {
	for {
		v.mu.Lock()
		var key string
		var e *expectation
		for k, x := range v.expect {
			if match(k, x) {
				key, e = k, x
				break
			}
		}
		v.mu.Unlock()
		if e == nil {
			return
		}
		if e.met(v.stored(key)) {
			v.settle(key, e)
			continue
		}
		left := e.deadline.Sub(c.opts.Clock.Now())
		if left <= 0 {
			c.log.Warn("a read from the cache did not see the operator's own write in time (the watch lags); it answers what the cache holds",
				"view", v.key.String(), "object", key, "version", e.version, "timeout", c.opts.ReadYourWritesTimeout)
			v.settle(key, e)
			continue
		}
		t := c.opts.Clock.NewTimer(left)
		select {
		case <-e.done:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// writeWaker is each view's own event handler: a notification may settle the
// expectation of its object.
type writeWaker struct{ v *view }

func (w writeWaker) OnAdd(obj any, _ bool) { w.notified(obj) }
func (w writeWaker) OnUpdate(_, obj any)   { w.notified(obj) }
func (w writeWaker) OnDelete(obj any)      { w.notified(obj) }
func (w writeWaker) notified(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	w.v.mu.Lock()
	e := w.v.expect[key]
	w.v.mu.Unlock()
	if e != nil && e.met(w.v.stored(key)) {
		w.v.settle(key, e)
	}
}

// VersionOlder compares resourceVersions. They are opaque by API convention but are
// etcd revisions in practice; when either does not parse, only equality is known
// (a different version counts as older).
func VersionOlder(rv, than string) bool {
	a, errA := strconv.ParseUint(rv, 10, 64)
	b, errB := strconv.ParseUint(than, 10, 64)
	if errA != nil || errB != nil {
		return rv != than
	}
	return a < b
}

// VersionNewer reports whether resourceVersion rv is known to be newer than than:
// both parse as numbers (as the API server issues them) and rv is greater. Unlike
// VersionOlder it answers false when the two cannot be compared.
func VersionNewer(rv, than string) bool {
	a, errA := strconv.ParseUint(rv, 10, 64)
	b, errB := strconv.ParseUint(than, 10, 64)
	return errA == nil && errB == nil && a > b
}
