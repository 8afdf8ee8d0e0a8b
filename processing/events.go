package processing

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// newEventRecorder posts Kubernetes Events through client-go's broadcaster, whose
// correlator aggregates repeats and rate-limits each object's events (a burst of 25,
// then one per 5 minutes), so a retry loop cannot flood the API server.
func newEventRecorder(core kubernetes.Interface) (record.EventRecorder, func()) {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: core.CoreV1().Events("")})
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "luaop"}), b.Shutdown
}

func (c *cycle) post(eventType, reason, message string) {
	if c.op.recorder == nil {
		return
	}
	c.op.recorder.Event(c.body, eventType, reason, truncate(message, 1000))
}
