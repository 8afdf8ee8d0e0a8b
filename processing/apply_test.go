package processing

import (
	"context"
	"reflect"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/luaop/luaop/processing/causes"
)

// The /status write is a JSON patch: keys holding "~" or "/" (a label-like key
// "example.com/owner") must be escaped as RFC 6901 says, or the patch names another
// path.
func TestStatusOpsEscapeKeys(t *testing.T) {
	body := map[string]any{"status": map[string]any{"a~b": "old"}}
	patch := map[string]any{"status": map[string]any{
		"a~b":               "new",
		"example.com/owner": "me",
		"plain":             nil, // absent: skipped
	}}
	want := []map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": "u1"},
		{"op": "add", "path": "/status/a~0b", "value": "new"},
		{"op": "test", "path": "/status/example.com~1owner", "value": nil},
		{"op": "add", "path": "/status/example.com~1owner", "value": "me"},
	}
	if got := statusOps(body, patch, "u1"); !reflect.DeepEqual(got, want) {
		t.Errorf("statusOps =\n%v\nwant\n%v", got, want)
	}
}

// Objects are kept and handed to handlers without metadata.managedFields (stripped
// in the informer's cache, and in the patch responses that stand for the watch's
// body): server-side apply bookkeeping nothing reads, a third of a small object.
func TestBodiesHaveNoManagedFields(t *testing.T) {
	h := newFakeHandlers()
	var mu sync.Mutex
	var seen []map[string]any
	h.add(changeSpec("create_fn", causes.Create), func(ctx context.Context, call causes.Call) (causes.Result, error) {
		mu.Lock()
		seen = append(seen, call.Cause.Body)
		mu.Unlock()
		return causes.Result{}, nil
	})
	e := startEnv(t, h, Options{})
	obj := widgetObject("w1", "uid-w1", map[string]any{"size": int64(1)})
	obj.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1"}})
	if _, err := e.dyn.Resource(widgetsGVR).Namespace("default").Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the create handler ran", func() bool { return len(h.callsOf("create_fn", "")) == 1 })
	mu.Lock()
	defer mu.Unlock()
	meta, _ := seen[0]["metadata"].(map[string]any)
	if _, has := meta["managedFields"]; has || meta["name"] != "w1" {
		t.Errorf("the handler's body metadata = %v: want the object's, without managedFields", meta)
	}
}
