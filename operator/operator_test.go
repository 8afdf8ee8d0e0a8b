package operator

import (
	"testing"

	"k8s.io/client-go/rest"

	"github.com/luaop/luaop/eventing"
	"github.com/luaop/luaop/kubeclient"
	"github.com/luaop/luaop/luabind"
	"github.com/luaop/luaop/processing"
)

// newUnstarted makes an operator against an address nothing answers: New contacts no
// server, and the test only looks at the wiring.
func newUnstarted(t *testing.T, popts processing.Options) *Operator {
	t.Helper()
	op, err := New(&rest.Config{Host: "http://127.0.0.1:1"}, Options{
		Scripts:    []luabind.Script{{Name: "x.lua", Source: []byte("")}},
		Processing: popts,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		op.runtime.Close()
		op.stopEvents()
	})
	return op
}

// The framework's Events and the scripts' go through one recorder, so one rate limit
// and one aggregation cover both.
func TestNewSharesOneEventRecorder(t *testing.T) {
	op := newUnstarted(t, processing.Options{}) // PostEvents nil means true
	rec, ok := op.opts.Processing.Recorder.(*eventing.Recorder)
	if !ok || rec == nil {
		t.Fatalf("processing's recorder is %T, want the shared *eventing.Recorder", op.opts.Processing.Recorder)
	}
	kube, ok := op.opts.Runtime.Kube.(*kubeclient.Client)
	if !ok {
		t.Fatalf("the scripts' client is %T", op.opts.Runtime.Kube)
	}
	if kube.Recorder != rec {
		t.Errorf("the scripts' recorder %v is not processing's %v", kube.Recorder, rec)
	}
}

// With PostEvents off there is no recorder: the scripts' luaop.info/warn/exception
// succeed and post nothing.
func TestNewWithoutEventsHasNoRecorder(t *testing.T) {
	off := false
	op := newUnstarted(t, processing.Options{PostEvents: &off})
	if op.opts.Processing.Recorder != nil {
		t.Errorf("processing got a recorder with PostEvents off: %T", op.opts.Processing.Recorder)
	}
	if kube := op.opts.Runtime.Kube.(*kubeclient.Client); kube.Recorder != nil {
		t.Errorf("the scripts got a recorder with PostEvents off: %T", kube.Recorder)
	}
}
