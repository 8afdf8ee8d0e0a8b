package eventing

import (
	"context"
	"fmt"
	"sync"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/reference"
)

// Component is the source component of every Event luaop posts.
const Component = "luaop"

// MaxMessageLength is the length past which messages are truncated (as processing does).
const MaxMessageLength = 1000

// Recorder is a record.EventRecorder writing core/v1 Events through client-go's
// broadcaster. Its correlator keeps client-go's defaults, which are what we want:
// per object (and event type) a burst of 25 Events, then one per 5 minutes, so a
// handler retrying in a loop cannot flood the API server; repeats of one Event become
// a count on it (a patch), and more than 10 similar Events (same object, type and
// reason, different messages) within 10 minutes become one "(combined from similar
// events)" Event.
//
// The broadcaster starts with the first Event (so an operator that is made but never
// started runs nothing); after Shutdown, Events are dropped.
type Recorder struct {
	core kubernetes.Interface

	mu          sync.Mutex
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	closed      bool
}

var _ record.EventRecorder = (*Recorder)(nil)

// New makes a recorder posting to the core/v1 Events API of core. Call Shutdown when
// done with it.
func New(core kubernetes.Interface) *Recorder {
	return &Recorder{core: core}
}

// NewForConfig is New with a clientset of its own (so a client-side rate limit of its
// own, apart from the operator's other requests).
func NewForConfig(cfg *rest.Config) (*Recorder, error) {
	core, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return New(core), nil
}

// get returns the started recorder, or nil after Shutdown.
func (r *Recorder) get() record.EventRecorder {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if r.recorder == nil {
		r.broadcaster = record.NewBroadcaster()
		r.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.core.CoreV1().Events("")})
		r.recorder = r.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component})
	}
	return r.recorder
}

// Event implements record.EventRecorder.
func (r *Recorder) Event(object runtime.Object, eventtype, reason, message string) {
	if rec := r.get(); rec != nil {
		rec.Event(object, eventtype, reason, message)
	}
}

// Eventf implements record.EventRecorder.
func (r *Recorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	if rec := r.get(); rec != nil {
		rec.Eventf(object, eventtype, reason, messageFmt, args...)
	}
}

// AnnotatedEventf implements record.EventRecorder.
func (r *Recorder) AnnotatedEventf(object runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	if rec := r.get(); rec != nil {
		rec.AnnotatedEventf(object, annotations, eventtype, reason, messageFmt, args...)
	}
}

// EventOfAnyType posts an Event whose type is neither Normal nor Warning (kopf's
// kopf.event takes any type; client-go's recorder drops such Events): written at
// once through the core/v1 Events API, which accepts any type, without the
// recorder's aggregation and rate limit. Normal and Warning go through the recorder
// as Event does. After Shutdown it posts nothing.
func (r *Recorder) EventOfAnyType(ctx context.Context, object runtime.Object, eventtype, reason, message string) error {
	if eventtype == corev1.EventTypeNormal || eventtype == corev1.EventTypeWarning {
		r.Event(object, eventtype, reason, message)
		return nil
	}
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil
	}
	ref, err := reference.GetReference(scheme.Scheme, object)
	if err != nil {
		return fmt.Errorf("an event's object: %w", err)
	}
	namespace := ref.Namespace
	if namespace == "" {
		namespace = metav1.NamespaceDefault // as client-go's recorder does
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%v.%x", ref.Name, now.UnixNano()), Namespace: namespace},
		InvolvedObject: *ref, Reason: reason, Message: message, Type: eventtype,
		FirstTimestamp: now, LastTimestamp: now, Count: 1, Source: corev1.EventSource{Component: Component},
	}
	_, err = r.core.CoreV1().Events(namespace).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// Shutdown stops the broadcaster (Events already queued are still written, best
// effort); later Events are dropped. It is safe to call more than once.
func (r *Recorder) Shutdown() {
	r.mu.Lock()
	b := r.broadcaster
	r.closed = true
	r.mu.Unlock()
	if b != nil {
		b.Shutdown()
	}
}

// Truncate shortens a message to at most MaxMessageLength bytes, cut at a character
// boundary, plus "...".
func Truncate(message string) string {
	if len(message) <= MaxMessageLength {
		return message
	}
	n := MaxMessageLength
	for n > 0 && !utf8.RuneStart(message[n]) {
		n--
	}
	return message[:n] + "..."
}
