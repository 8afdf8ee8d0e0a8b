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
	diffBase state.DiffBaseStorage
	// Which of the two live in status.
	progressInStatus, diffBaseInStatus bool
	reason                             string
}

func (i *resourceInfo) storage() *storage { return i.store.Load() }

// inStatus: progress and diff-base both in status, so a handled change of a resource
// with a status subresource is one /status patch.
func (s *storage) inStatus() bool { return s.progressInStatus && s.diffBaseInStatus }

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
	return &storage{progress: state.NewSmartProgress(annotationsP, statusP), diffBase: state.NewSmartDiffBase(annotationsD, statusD), reason: reason}
}

// crdKeepsStatusField reads the resource's CRD: does the served version's schema keep
// status.<StatusField>? Built-in resources have no CRD (annotations, then).
func (o *Reactor) crdKeepsStatusField(ctx context.Context, gvr schema.GroupVersionResource) (bool, string) {
	if gvr.Group == "" || !strings.Contains(gvr.Group, ".") {
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
		status, _, _ := unstructured.NestedMap(version, "schema", "openAPIV3Schema", "properties", "status")
		if keep, _ := status["x-kubernetes-preserve-unknown-fields"].(bool); keep {
			return true, ""
		}
		// A declared field keeps what luaop writes only if it keeps unknown fields
		// itself (luaop writes progress.<handler id> and last-handled-configuration).
		declared := status
		for _, part := range strings.Split(o.opts.StatusField, ".") {
			declared, _, _ = unstructured.NestedMap(declared, "properties", part)
		}
		if keep, _ := declared["x-kubernetes-preserve-unknown-fields"].(bool); keep {
			return true, ""
		}
		return false, "the status schema would prune status." + o.opts.StatusField +
			" (add x-kubernetes-preserve-unknown-fields: true under status to get one write per change)"
	}
	return false, "its CustomResourceDefinition does not serve " + gvr.Version
}

// fallBackIfStoragePruned: the server dropped the status field of the storage (the
// schema changed since it was chosen). The resource's storage goes back to
// annotations for good, and what was just pruned is written there, in this cycle's
// next patch, so no handler runs again for it. Returns that patch's part.
func (c *cycle) fallBackIfStoragePruned(sent map[string]any, resp *unstructured.Unstructured) map[string]any {
	path := append([]string{"status"}, strings.Split(c.op.opts.StatusField, ".")...)
	sentOurs, ok, _ := unstructured.NestedFieldNoCopy(sent, path...)
	ours, _ := sentOurs.(map[string]any)
	if !ok || ours == nil || !c.store.progressInStatus && !c.store.diffBaseInStatus {
		return nil
	}
	// Kept only if every part sent came back (a declared but closed field keeps
	// an empty map and drops what is inside).
	pruned := false
	for key, v := range ours {
		if v == nil {
			continue
		}
		if _, kept, _ := unstructured.NestedFieldNoCopy(resp.Object, append(path, key)...); !kept {
			pruned = true
		}
	}
	if !pruned {
		return nil
	}
	fallback := c.op.annotationsStorage("the server pruned status." + c.op.opts.StatusField + " (the CRD's schema does not keep it)")
	c.info.store.Store(fallback)
	c.store = fallback
	c.log.Warn("status storage pruned by the server: this resource keeps its progress in annotations from now on",
		"resource", c.key.resource.String(), "reason", fallback.reason)
	patch := state.NewPatch()
	state.MoveStatusBookkeeping(ours, c.op.opts.Prefix, c.body.Object, patch)
	return patch.Map()
}
