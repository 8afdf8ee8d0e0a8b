package luabind

import (
	"context"
	"encoding/json"
	"log/slog"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"

	"github.com/luaop/luaop/state"
)

// DryRunKube wraps the scripts' cluster access for a dry run (luaop run --dry-run):
// get and list read the cluster; create, patch, delete, apply and events are logged
// as they would have been sent, and not sent. Scripts carry on with a plausible
// answer: create and apply return the object given, patch the current object with
// a merge patch applied (other patch types: the current object), delete true. A
// patch or delete of an object that does not exist answers NotFound, as the
// cluster would.
func DryRunKube(k Kube, log *slog.Logger) Kube {
	if log == nil {
		log = slog.Default()
	}
	return &dryRunKube{k: k, log: log}
}

type dryRunKube struct {
	k   Kube
	log *slog.Logger
}

func jsonText(v any) string {
	data, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

func (d *dryRunKube) Get(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	return d.k.Get(ctx, apiVersion, kind, namespace, name)
}

func (d *dryRunKube) List(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error) {
	return d.k.List(ctx, apiVersion, kind, namespace, selector)
}

func (d *dryRunKube) Create(_ context.Context, obj map[string]any) (map[string]any, error) {
	d.log.Info("dry run: not sent", "call", "luaop.kube.create", "object", jsonText(obj))
	return obj, nil
}

func (d *dryRunKube) Patch(ctx context.Context, apiVersion, kind, namespace, name string, patch any, patchType string) (map[string]any, error) {
	current, err := d.k.Get(ctx, apiVersion, kind, namespace, name)
	if err != nil {
		return nil, err
	}
	d.log.Info("dry run: not sent", "call", "luaop.kube.patch", "apiVersion", apiVersion, "kind", kind,
		"namespace", namespace, "name", name, "type", patchType, "patch", jsonText(patch))
	if patchType != "" && patchType != "merge" {
		return current, nil
	}
	cur, _ := json.Marshal(current)
	p, _ := json.Marshal(patch)
	merged, err := jsonpatch.MergePatch(cur, p)
	if err != nil {
		return current, nil
	}
	var out map[string]any
	if json.Unmarshal(merged, &out) != nil {
		return current, nil
	}
	return out, nil
}

func (d *dryRunKube) Delete(ctx context.Context, apiVersion, kind, namespace, name string) error {
	if _, err := d.k.Get(ctx, apiVersion, kind, namespace, name); err != nil {
		return err
	}
	d.log.Info("dry run: not sent", "call", "luaop.kube.delete", "apiVersion", apiVersion, "kind", kind, "namespace", namespace, "name", name)
	return nil
}

func (d *dryRunKube) Apply(_ context.Context, obj map[string]any, force bool) (map[string]any, error) {
	d.log.Info("dry run: not sent", "call", "luaop.kube.apply", "force", force, "object", jsonText(obj))
	return obj, nil
}

// Event checks the event as the wrapped client does (its recorder must be nil: a
// client without one validates and posts nothing), then logs it.
func (d *dryRunKube) Event(ctx context.Context, obj map[string]any, eventType, reason, message string) error {
	if err := d.k.Event(ctx, obj, eventType, reason, message); err != nil {
		return err
	}
	_, kind, ns, name := state.Identity(obj)
	d.log.Info("dry run: event not posted", "object", kind+" "+ns+"/"+name, "type", eventType, "reason", reason, "message", message)
	return nil
}

// GetLive and ListLive are the wrapped client's live reads (LiveReads), or its
// reads when it has none.
func (d *dryRunKube) GetLive(ctx context.Context, apiVersion, kind, namespace, name string) (map[string]any, error) {
	if lr, ok := d.k.(LiveReads); ok {
		return lr.GetLive(ctx, apiVersion, kind, namespace, name)
	}
	return d.k.Get(ctx, apiVersion, kind, namespace, name)
}

func (d *dryRunKube) ListLive(ctx context.Context, apiVersion, kind, namespace, selector string) ([]map[string]any, error) {
	if lr, ok := d.k.(LiveReads); ok {
		return lr.ListLive(ctx, apiVersion, kind, namespace, selector)
	}
	return d.k.List(ctx, apiVersion, kind, namespace, selector)
}
