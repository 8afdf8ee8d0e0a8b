package kubeclient

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/reference"

	"github.com/luaop/luaop/eventing"
)

func widget() map[string]any {
	return map[string]any{
		"apiVersion": "examples.luaop.dev/v1",
		"kind":       "Widget",
		"metadata": map[string]any{
			"name": "w", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
			"labels": map[string]any{"big": "body, not needed by the reference"},
		},
		"spec": map[string]any{"size": int64(1)},
	}
}

// eventWrites counts the Event creates and patches the fake clientset received.
func eventWrites(cs *fake.Clientset) (creates, patches int) {
	for _, a := range cs.Actions() {
		if a.GetResource().Resource != "events" {
			continue
		}
		switch a.GetVerb() {
		case "create":
			creates++
		case "patch":
			patches++
		}
	}
	return
}

// markerWritten reports whether the Normal "Marker" Event was written.
func markerWritten(t *testing.T, cs *fake.Clientset) bool {
	list, err := cs.CoreV1().Events("ns").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason == "Marker" {
			return true
		}
	}
	return false
}

// A handler retrying in a loop calls luaop.warn on every attempt: 100 posts about
// one object reach the API server as at most the correlator's burst (25) of writes,
// and repeats are aggregated instead of each making an Event.
func TestEventPostsAreRateLimitedAndAggregated(t *testing.T) {
	for _, tc := range []struct {
		name    string
		message func(i int) string
		check   func(t *testing.T, events []corev1.Event)
	}{
		{
			// Same message every time: one Event whose count grows (patches).
			name:    "identical messages",
			message: func(int) string { return "the database does not answer" },
			check: func(t *testing.T, events []corev1.Event) {
				if len(events) != 1 {
					t.Fatalf("want one Event counting the repeats, got %d", len(events))
				}
				if events[0].Count < 2 {
					t.Errorf("the repeats are not counted on the Event: count %d", events[0].Count)
				}
			},
		},
		{
			// A different message per attempt: after 10 similar Events (same object,
			// type and reason) the correlator combines them into one Event.
			name:    "a message per attempt",
			message: func(i int) string { return fmt.Sprintf("attempt %d: the database does not answer", i) },
			check: func(t *testing.T, events []corev1.Event) {
				var combined *corev1.Event
				for i := range events {
					if strings.HasPrefix(events[i].Message, "(combined from similar events)") {
						combined = &events[i]
					}
				}
				if combined == nil {
					t.Fatalf("no combined Event among %d", len(events))
				}
				if combined.Count < 2 {
					t.Errorf("the combined Event counts %d, want more than 1", combined.Count)
				}
				if len(events) > 10 {
					t.Errorf("%d Events; similar ones should be combined after 10", len(events))
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			rec := eventing.New(cs)
			defer rec.Shutdown()
			c := &Client{Recorder: rec}
			const posts = 100
			for i := range posts {
				if err := c.Event(t.Context(), widget(), "Warning", "Flaky", tc.message(i)); err != nil {
					t.Fatalf("post %d: %v", i, err)
				}
			}
			// Posting is asynchronous but in order: the recorder writes Events one by
			// one. A Normal Event posted last (not limited by the Warning burst: the
			// correlator keys its limit by type) is the barrier: once it is written,
			// every Warning before it has been written or dropped.
			if err := c.Event(t.Context(), widget(), "Normal", "Marker", "the last post"); err != nil {
				t.Fatal(err)
			}
			const burst = 25
			deadline := time.Now().Add(10 * time.Second)
			for !markerWritten(t, cs) {
				if time.Now().After(deadline) {
					t.Fatal("the last post (a Normal Event) was not written within 10s")
				}
				time.Sleep(20 * time.Millisecond)
			}
			creates, patches := eventWrites(cs)
			creates-- // the marker
			t.Logf("%d posts: %d creates, %d patches", posts, creates, patches)
			if creates+patches == 0 {
				t.Fatal("no Event was written")
			}
			if creates+patches > 30 {
				t.Errorf("%d posts made %d creates and %d patches; want at most the burst of %d", posts, creates, patches, burst)
			}
			list, err := cs.CoreV1().Events("ns").List(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var total int32
			var warnings []corev1.Event
			for _, e := range list.Items {
				if e.Reason == "Marker" {
					continue
				}
				warnings = append(warnings, e)
				if e.InvolvedObject.Name != "w" || e.InvolvedObject.Kind != "Widget" || e.InvolvedObject.UID != "u-1" ||
					e.Type != "Warning" || e.Reason != "Flaky" || e.Source.Component != "luaop" {
					t.Errorf("unexpected Event %s: %+v %s %s %+v", e.Name, e.InvolvedObject, e.Type, e.Reason, e.Source)
				}
				total += e.Count
			}
			if total > burst {
				t.Errorf("the Events count %d posts, more than the burst of %d", total, burst)
			}
			tc.check(t, warnings)
		})
	}
}

// captured records what reached the recorder.
type captured struct {
	object                     runtime.Object
	eventType, reason, message string
}

type captureRecorder struct {
	mu     sync.Mutex
	events []captured
}

func (r *captureRecorder) Event(object runtime.Object, eventtype, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, captured{object, eventtype, reason, message})
}

func (r *captureRecorder) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	r.Event(object, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (r *captureRecorder) AnnotatedEventf(object runtime.Object, _ map[string]string, eventtype, reason, messageFmt string, args ...any) {
	r.Eventf(object, eventtype, reason, messageFmt, args...)
}

func TestEventRefersToTheObjectAndTruncatesLongMessages(t *testing.T) {
	rec := &captureRecorder{}
	c := &Client{Recorder: rec}
	long := strings.Repeat("x", 2500)
	if err := c.Event(t.Context(), widget(), "Normal", "Done", long); err != nil {
		t.Fatal(err)
	}
	if len(rec.events) != 1 {
		t.Fatalf("want 1 event, got %d", len(rec.events))
	}
	got := rec.events[0]
	if got.eventType != "Normal" || got.reason != "Done" {
		t.Errorf("type %q reason %q", got.eventType, got.reason)
	}
	if len(got.message) != 1003 || !strings.HasSuffix(got.message, "...") {
		t.Errorf("message of %d bytes, want 1000 and \"...\"", len(got.message))
	}
	ref, err := reference.GetReference(nil, got.object)
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.ObjectReference{APIVersion: "examples.luaop.dev/v1", Kind: "Widget", Namespace: "ns", Name: "w", UID: "u-1", ResourceVersion: "7"}
	if *ref != want {
		t.Errorf("reference %+v, want %+v", *ref, want)
	}
}

func TestEventChecksItsArguments(t *testing.T) {
	noKind := widget()
	delete(noKind, "kind")
	noName := widget()
	delete(noName["metadata"].(map[string]any), "name")
	noMeta := map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}
	badVersion := widget()
	badVersion["apiVersion"] = "a/b/c"
	for _, tc := range []struct {
		name              string
		obj               map[string]any
		eventType, reason string
		want              string
	}{
		{"type", widget(), "Info", "R", `event type "Info"`},
		{"empty type", widget(), "", "R", `event type ""`},
		{"reason", widget(), "Normal", " ", "needs a reason"},
		{"no kind", noKind, "Normal", "R", "apiVersion, kind and metadata.name"},
		{"no name", noName, "Warning", "R", "apiVersion, kind and metadata.name"},
		{"no metadata", noMeta, "Warning", "R", "apiVersion, kind and metadata.name"},
		{"nil object", nil, "Warning", "R", "apiVersion, kind and metadata.name"},
		{"bad apiVersion", badVersion, "Warning", "R", "apiVersion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &captureRecorder{}
			c := &Client{Recorder: rec}
			err := c.Event(t.Context(), tc.obj, tc.eventType, tc.reason, "m")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
			if len(rec.events) != 0 {
				t.Errorf("an invalid event was posted: %+v", rec.events)
			}
		})
	}
}

// With Events turned off (no recorder) a valid call succeeds and posts nothing; an
// invalid one still fails, so scripts see their mistakes either way.
func TestEventWithoutRecorderDoesNothing(t *testing.T) {
	c := &Client{}
	if err := c.Event(t.Context(), widget(), "Warning", "Flaky", "m"); err != nil {
		t.Errorf("a valid event without a recorder: %v", err)
	}
	if err := c.Event(t.Context(), widget(), "", "Flaky", "m"); err == nil {
		t.Error("an invalid event (no type) without a recorder should still fail")
	}
	if err := c.Event(t.Context(), widget(), "Warning", "", "m"); err == nil {
		t.Error("an invalid event (no reason) without a recorder should still fail")
	}
}

// kopf's kopf.event takes any type ("SomeType"): client-go's recorder drops such
// Events, so the operator's recorder writes them itself, at once; the core/v1 Events
// API accepts any type. A recorder without that capability refuses them.
func TestEventOfAnyType(t *testing.T) {
	cs := fake.NewClientset()
	rec := eventing.New(cs)
	defer rec.Shutdown()
	c := &Client{Recorder: rec}
	if err := c.Event(t.Context(), widget(), "SomeType", "SomeReason", "Some message"); err != nil {
		t.Fatal(err)
	}
	list, err := cs.CoreV1().Events("ns").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Type != "SomeType" || list.Items[0].Reason != "SomeReason" ||
		list.Items[0].InvolvedObject.Name != "w" || list.Items[0].InvolvedObject.UID != "u-1" || list.Items[0].Source.Component != "luaop" {
		t.Fatalf("events %+v, want one SomeType Event about w", list.Items)
	}
	plain := &Client{Recorder: &captureRecorder{}}
	if err := plain.Event(t.Context(), widget(), "SomeType", "SomeReason", ""); err == nil || !strings.Contains(err.Error(), `use "Normal" or "Warning"`) {
		t.Errorf("a recorder that cannot: err = %v", err)
	}
	if err := c.Event(t.Context(), widget(), "", "SomeReason", ""); err == nil {
		t.Error("an empty type is accepted")
	}
}
