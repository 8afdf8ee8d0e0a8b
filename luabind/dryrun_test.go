package luabind

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// recordingKube answers reads from objects and counts writes (there must be none).
type recordingKube struct {
	Kube    // nil: the dry run must call no other method
	objects map[string]map[string]any
	writes  []string
	events  int
}

func (k *recordingKube) Get(_ context.Context, _, kind, ns, name string) (map[string]any, error) {
	if o, ok := k.objects[kind+"/"+ns+"/"+name]; ok {
		return o, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: strings.ToLower(kind) + "s"}, name)
}
func (k *recordingKube) Create(context.Context, map[string]any) (map[string]any, error) {
	k.writes = append(k.writes, "create")
	return nil, nil
}
func (k *recordingKube) Event(context.Context, map[string]any, string, string, string) error {
	k.events++ // the dry-run client's Event only validates
	return nil
}

// In a dry run the scripts' writes are logged, not sent, and the scripts get
// plausible answers; reads still reach the cluster.
func TestDryRunKube(t *testing.T) {
	inner := &recordingKube{objects: map[string]map[string]any{
		"ConfigMap/ns/reg": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "reg", "namespace": "ns"}, "data": map[string]any{"a": "1"}},
	}}
	var logs bytes.Buffer
	k := DryRunKube(inner, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := t.Context()
	cm := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "x", "namespace": "ns"}}
	if got, err := k.Create(ctx, cm); err != nil || got["kind"] != "ConfigMap" {
		t.Errorf("create: %v %v", got, err)
	}
	if got, err := k.Apply(ctx, cm, true); err != nil || got["kind"] != "ConfigMap" {
		t.Errorf("apply: %v %v", got, err)
	}
	got, err := k.Patch(ctx, "v1", "ConfigMap", "ns", "reg", map[string]any{"data": map[string]any{"a": nil, "b": "2"}}, "merge")
	if err != nil || got["data"].(map[string]any)["b"] != "2" || got["data"].(map[string]any)["a"] != nil {
		t.Errorf("patch: %v %v", got, err)
	}
	if _, err := k.Patch(ctx, "v1", "ConfigMap", "ns", "missing", map[string]any{}, "merge"); !apierrors.IsNotFound(err) {
		t.Errorf("patch of a missing object: %v, want NotFound", err)
	}
	if err := k.Delete(ctx, "v1", "ConfigMap", "ns", "reg"); err != nil {
		t.Errorf("delete: %v", err)
	}
	if err := k.Event(ctx, cm, "Normal", "Done", "msg"); err != nil || inner.events != 1 {
		t.Errorf("event: %v (validated %d times)", err, inner.events)
	}
	if len(inner.writes) != 0 {
		t.Errorf("writes reached the cluster: %v", inner.writes)
	}
	for _, want := range []string{"call=luaop.kube.create", "call=luaop.kube.apply", "call=luaop.kube.patch", `patch="{\"data\":{\"a\":null,\"b\":\"2\"}}"`, "call=luaop.kube.delete", "dry run: event not posted"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, logs.String())
		}
	}
}
