package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/kubeclient"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/operator"
)

// applyDryRun makes an operator's options write nothing (--dry-run): the core logs
// its patches and finalizer changes instead of sending them (processing's DryRun),
// the scripts' luaop.kube writes and events are logged, and the framework's Events
// go to the log. Reads still go to the cluster.
func applyDryRun(cfg *rest.Config, opts *operator.Options, log *slog.Logger, fieldManager string) error {
	opts.Processing.DryRun = true
	opts.Processing.Recorder = dryRunRecorder{log: log}
	kube, err := kubeclient.New(cfg)
	if err != nil {
		return fmt.Errorf("creating the scripts' cluster client: %w", err)
	}
	kube.Recorder = nil // validates events, posts none
	if fieldManager != "" {
		kube.FieldManager = fieldManager
	}
	opts.Runtime.Kube = luabind.DryRunKube(kube, log)
	return nil
}

// dryRunRecorder logs the framework's Events instead of posting them.
type dryRunRecorder struct{ log *slog.Logger }

func (r dryRunRecorder) Event(object runtime.Object, eventtype, reason, message string) {
	name := ""
	if m, err := meta.Accessor(object); err == nil {
		name = m.GetNamespace() + "/" + m.GetName()
	}
	r.log.Info("dry run: event not posted", "object", name, "type", eventtype, "reason", reason, "message", message)
}

func (r dryRunRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	r.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (r dryRunRecorder) AnnotatedEventf(object runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...any) {
	r.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

// logOutput receives the logs of run (tests capture them).
var logOutput io.Writer = os.Stderr
