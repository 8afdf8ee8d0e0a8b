package processing

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/luaop/luaop/state"
)

// storage is where one resource's bookkeeping (per-handler progress, diff-base)
// lives. Chosen when the resource is resolved, replaced when the server turns out to
// prune it; a cycle takes it once at its start.
type storage struct {
	progress state.ProgressStorage
	// diffBase keeps sensitive values (a Secret's data) as digests: state.NewDigestingDiffBase.
	diffBase state.DiffBaseStorage
	// Which of the two live in status.
	progressInStatus, diffBaseInStatus bool
	reason                             string
}

func (i *resourceInfo) storage() *storage { return i.store.Load() }

// inStatus: progress and diff-base both in status, so a handled change of a resource
// with a status subresource is one /status patch.
func (s *storage) inStatus() bool { return s.progressInStatus && s.diffBaseInStatus }

// where names the storage for people: status, annotations, or which part is where.
func (s *storage) where() string {
	switch {
	case s.inStatus():
		return "status"
	case s.progressInStatus:
		return "progress in status, diff-base in annotations"
	case s.diffBaseInStatus:
		return "diff-base in status, progress in annotations"
	}
	return "annotations"
}

var crdsGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// chooseStorage decides, per resource, where its bookkeeping goes. With "auto" it is
// status when the resource has a status subresource and its schema keeps the status
// field (x-kubernetes-preserve-unknown-fields under status, or the field declared),
// else annotations. Both storages are always read (state.NewSmart*), so objects
// handled in the other mode are not handled again.
func (o *Reactor) chooseStorage(ctx context.Context, info *resourceInfo) *storage {
	statusOK, why := false, "status is not a subresource of this resource"
	if info.statusSubresource {
		statusOK, why = o.crdKeepsStatusField(ctx, info.gvr)
	}
	return o.storageFor(statusOK, why)
}

func (o *Reactor) storageFor(statusOK bool, why string) *storage {
	inStatus := func(m StorageMode) bool {
		return m == StorageStatus || (m == StorageAuto && statusOK)
	}
	annotationsP, statusP := state.NewAnnotationsProgress(o.opts.Prefix), state.NewStatusProgress(o.opts.StatusField)
	annotationsD, statusD := state.NewAnnotationsDiffBase(o.opts.Prefix), state.NewStatusDiffBase(o.opts.StatusField)
	s := &storage{}
	progressInStatus, diffBaseInStatus := inStatus(o.opts.ProgressStorage), inStatus(o.opts.DiffBaseStorage)
	if progressInStatus {
		s.progress = state.NewSmartProgress(statusP, annotationsP)
	} else {
		s.progress = state.NewSmartProgress(annotationsP, statusP)
	}
	if diffBaseInStatus {
		s.diffBase = state.NewSmartDiffBase(statusD, annotationsD)
	} else {
		s.diffBase = state.NewSmartDiffBase(annotationsD, statusD)
	}
	if o.opts.Progress != nil {
		s.progress, progressInStatus = o.opts.Progress, false
	}
	if o.opts.DiffBase != nil {
		s.diffBase, diffBaseInStatus = o.opts.DiffBase, false
	}
	s.progressInStatus, s.diffBaseInStatus = progressInStatus, diffBaseInStatus
	s.diffBase = state.NewDigestingDiffBase(s.diffBase, nil, heldBackKey(o.opts.Prefix))
	switch {
	case o.opts.Progress != nil || o.opts.DiffBase != nil:
		s.reason = "custom storage"
	case o.opts.ProgressStorage != StorageAuto || o.opts.DiffBaseStorage != StorageAuto:
		s.reason = fmt.Sprintf("set: progress in %s, diff-base in %s", o.opts.ProgressStorage, o.opts.DiffBaseStorage)
	case statusOK:
		s.reason = "status is a subresource and its schema keeps status." + o.opts.StatusField + ": one /status patch per handled change"
	default:
		s.reason = why
	}
	return s
}

// annotationsStorage keeps everything in annotations, whatever the settings: the
// fallback when the server prunes status storage.
func (o *Reactor) annotationsStorage(reason string) *storage {
	annotationsP, statusP := state.NewAnnotationsProgress(o.opts.Prefix), state.NewStatusProgress(o.opts.StatusField)
	annotationsD, statusD := state.NewAnnotationsDiffBase(o.opts.Prefix), state.NewStatusDiffBase(o.opts.StatusField)
	diffBase := state.NewDigestingDiffBase(state.NewSmartDiffBase(annotationsD, statusD), nil, heldBackKey(o.opts.Prefix))
	return &storage{progress: state.NewSmartProgress(annotationsP, statusP), diffBase: diffBase, reason: reason}
}

// crdKeepsStatusField reads the resource's CRD: does the served version's schema keep
// status.<StatusField>? Built-in resources have no CRD (annotations, then).
func (o *Reactor) crdKeepsStatusField(ctx context.Context, gvr schema.GroupVersionResource) (bool, string) {
	if isBuiltIn(gvr) {
		return false, "a built-in resource: its status schema is fixed"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	crd, err := o.dynamic.Resource(crdsGVR).Get(ctx, gvr.Resource+"."+gvr.Group, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, "no CustomResourceDefinition for it (a built-in or aggregated resource)"
	case apierrors.IsForbidden(err):
		return false, "cannot read its CustomResourceDefinition (grant get on customresourcedefinitions to use status storage)"
	case err != nil:
		return false, fmt.Sprintf("cannot read its CustomResourceDefinition: %v", err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		version, _ := v.(map[string]any)
		if version["name"] != gvr.Version {
			continue
		}
		schemaRoot, _, _ := unstructured.NestedMap(version, "schema", "openAPIV3Schema")
		if schemaKeeps(schemaRoot, append([]string{"status"}, strings.Split(o.opts.StatusField, ".")...)) {
			return true, ""
		}
		return false, "the status schema would prune status." + o.opts.StatusField +
			" (add x-kubernetes-preserve-unknown-fields: true under status to get one write per change)"
	}
	return false, "its CustomResourceDefinition does not serve " + gvr.Version
}

// schemaKeeps: does a structural schema keep what luaop writes under path (maps of
// its own keys)? Each part of the path is either declared, and its schema decides
// below it, or not, and then kept only where the level above keeps unknown fields;
// the field itself must keep unknown fields.
func schemaKeeps(node map[string]any, path []string) bool {
	for _, part := range path {
		if declared, ok, _ := unstructured.NestedMap(node, "properties", part); ok {
			node = declared
			continue
		}
		keep, _ := node["x-kubernetes-preserve-unknown-fields"].(bool)
		return keep
	}
	keep, _ := node["x-kubernetes-preserve-unknown-fields"].(bool)
	return keep
}

// fallBackIfStoragePruned: the server dropped the status field of the storage (the
// schema changed since it was chosen, or status storage was set for a kind that keeps
// no such field). The resource's storage goes back to annotations for good, and what
// this cycle just wrote there is written again into annotations, in its next patch, so
// that no handler runs again for it. Returns that patch's part. (Other objects whose
// bookkeeping sat in status before the schema changed lose it with the schema: the
// server prunes what it reads from its storage too.)
func (c *cycle) fallBackIfStoragePruned(sent map[string]any, resp *unstructured.Unstructured) map[string]any {
	path := append([]string{"status"}, strings.Split(c.op.opts.StatusField, ".")...)
	sentOurs, ok, _ := unstructured.NestedFieldNoCopy(sent, path...)
	ours, _ := sentOurs.(map[string]any)
	if !ok || ours == nil || !c.store.progressInStatus && !c.store.diffBaseInStatus {
		return nil
	}
	got, _, _ := unstructured.NestedFieldNoCopy(resp.Object, path...)
	if keptAll(ours, got) {
		return nil
	}
	fallback := c.op.annotationsStorage("the server dropped status." + c.op.opts.StatusField + " (the kind's schema does not keep it)")
	// Every cycle of the resource that wrote to status at the time finds it pruned and
	// moves its own records; the one that swaps the storage says so.
	if c.info.store.CompareAndSwap(c.store, fallback) {
		c.log.Warn("status storage pruned by the server: this resource keeps its progress in annotations from now on",
			"reason", fallback.reason)
	}
	c.store = fallback
	patch := state.NewPatch()
	if err := state.MoveStatusBookkeeping(ours, c.op.opts.Prefix, resp.Object, patch); err != nil {
		c.log.Error("the last handled state cannot be moved into annotations; the next change is compared with an older one, if any", "error", err)
	}
	return patch.Map()
}

// keptAll: everything sent (but removals) is in got, at every depth: a schema may keep
// a map and prune what is inside it.
func keptAll(sent map[string]any, got any) bool {
	gotMap, _ := got.(map[string]any)
	for key, v := range sent {
		if v == nil {
			continue
		}
		g, present := gotMap[key]
		if !present {
			return false
		}
		if m, isMap := v.(map[string]any); isMap && !keptAll(m, g) {
			return false
		}
	}
	return true
}

// isBuiltIn: a resource of the core group or of a group without a dot, which no CRD
// can define (a guess for the others: some *.k8s.io groups are CRDs, some are not).
func isBuiltIn(gvr schema.GroupVersionResource) bool {
	return gvr.Group == "" || !strings.Contains(gvr.Group, ".")
}

// diffBaseRefresher is a diff-base storage that can rewrite an outdated stored
// diff-base (state.NewDigestingDiffBase: a Secret's values stored before digests).
type diffBaseRefresher interface {
	Refresh(obj map[string]any, patch *state.Patch) (bool, error)
}

// refreshDiffBase writes into the cycle's patch the stored diff-base again when its
// storage finds it outdated (a Secret's values kept as they are by an older luaop or
// by kopf), so that they leave the object at its next cycle even when nothing
// changed. It tells whether it wrote.
func (c *cycle) refreshDiffBase() bool {
	r, ok := c.store.diffBase.(diffBaseRefresher)
	if !ok {
		return false
	}
	wrote, err := r.Refresh(c.body.Object, c.patch)
	if err != nil {
		c.log.Error("cannot rewrite the stored diff-base without its sensitive values; it stays as it is", "error", err)
	}
	return wrote && err == nil
}
