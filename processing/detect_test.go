package processing

import (
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/util/json"

	"github.com/luaop/luaop/processing/causes"
	"github.com/luaop/luaop/state"
)

const (
	testPrefix    = "luaop.dev"
	testFinalizer = testPrefix + "/finalizer"
)

// widget is an object as client-go's unstructured decoder delivers it: integers are
// int64, lists are []any, maps are map[string]any.
func widget() map[string]any {
	return map[string]any{
		"apiVersion": "example.com/v1",
		"kind":       "Widget",
		"metadata": map[string]any{
			"name":              "w1",
			"namespace":         "default",
			"uid":               "0b6a3c1e-0000-4000-8000-000000000001",
			"resourceVersion":   "1000",
			"generation":        int64(1),
			"creationTimestamp": "2024-01-01T00:00:00Z",
			"labels":            map[string]any{"app": "demo"},
			"annotations":       map[string]any{"team": "blue"},
			"managedFields": []any{
				map[string]any{"manager": "kubectl", "operation": "Update", "apiVersion": "example.com/v1"},
			},
		},
		"spec": map[string]any{
			"replicas": int64(3),
			"image":    "nginx:1.25",
			"ports":    []any{int64(80), int64(443)},
			"tuning":   map[string]any{"ratio": 0.5, "enabled": true},
		},
		"status": map[string]any{"ready": false},
	}
}

// detectWithAnnotations is detectChangeCause with the diff-base in annotations and no
// fields outside the essence: the default the rules below are written against.
func detectWithAnnotations(body map[string]any, prefix, finalizer string, facts objectFacts) detectedCause {
	return detectChangeCause(body, causes.Resource{}, prefix, "luaop_dev", finalizer, state.NewAnnotationsDiffBase(prefix), facts, nil)
}

// mergePatched returns obj with the JSON merge patch applied as the API server applies it
// (RFC 7386, through the same library client-go's fake client uses), neither argument changed.
func mergePatched(obj, patch map[string]any) map[string]any {
	objJSON, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	patchJSON, err := json.Marshal(patch)
	if err != nil {
		panic(err)
	}
	merged, err := jsonpatch.MergePatch(objJSON, patchJSON)
	if err != nil {
		panic(err)
	}
	var out map[string]any
	if err := json.Unmarshal(merged, &out); err != nil {
		panic(err)
	}
	return out
}

// handled returns body as the API server would return it after the operator stored the
// diff-base of its current essence (the end of a fully handled cause).
func handled(t *testing.T, body map[string]any) map[string]any {
	t.Helper()
	patch := state.NewPatch()
	if err := state.StoreEssence(body, patch, testPrefix, state.Essence(body, testPrefix)); err != nil {
		t.Fatalf("StoreEssence: %v", err)
	}
	return mergePatched(body, patch.Map())
}

// edit returns a modified deep copy of body.
func edit(body map[string]any, fn func(b map[string]any)) map[string]any {
	out := state.DeepCopyValue(body).(map[string]any)
	fn(out)
	return out
}

// at returns the map at path, creating it as needed.
func at(body map[string]any, path ...string) map[string]any {
	cur := body
	for _, k := range path {
		next, ok := cur[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			cur[k] = next
		}
		cur = next
	}
	return cur
}

func deleting(b map[string]any) {
	at(b, "metadata")["deletionTimestamp"] = "2024-01-02T00:00:00Z"
}

func withFinalizers(fs ...string) func(map[string]any) {
	return func(b map[string]any) {
		list := make([]any, len(fs))
		for i, f := range fs {
			list[i] = f
		}
		at(b, "metadata")["finalizers"] = list
	}
}

func both(fns ...func(map[string]any)) func(map[string]any) {
	return func(b map[string]any) {
		for _, fn := range fns {
			fn(b)
		}
	}
}

func diffText(d state.Diff) []string {
	out := make([]string, len(d))
	for i, item := range d {
		out[i] = item.String()
	}
	return out
}

func TestDetectChangeCause(t *testing.T) {
	fresh := widget()
	base := handled(t, fresh)
	progress := state.NewAnnotationsProgress(testPrefix)
	// A creation's diff is one item: the whole essence added at the root.
	createDiff := []string{`add .: {"metadata":{"annotations":{"team":"blue"},"labels":{"app":"demo"}},` +
		`"spec":{"image":"nginx:1.25","ports":[80,443],"replicas":3,"tuning":{"enabled":true,"ratio":0.5}}}`}

	tests := []struct {
		name  string
		body  map[string]any
		facts objectFacts
		want  causes.Reason
		// wantDiff lists the diff as DiffItem.String() renders it; nil means no diff.
		wantDiff []string
		// wantOld/wantNew are checked at spec.replicas when set (update cases).
		wantOldReplicas, wantNewReplicas any
		wantOldIsNil                     bool
		wantProblem                      bool
	}{
		// Deletion comes first, whatever the diff-base says.
		{
			name: "deletion in progress without any finalizer is free",
			body: edit(base, deleting),
			want: causes.Free, wantOldIsNil: true,
		},
		{
			name: "deletion in progress with only foreign finalizers is free",
			body: edit(base, both(deleting, withFinalizers("kubernetes.io/pv-protection", "other.io/finalizer"))),
			want: causes.Free, wantOldIsNil: true,
		},
		{
			name: "deletion in progress with our finalizer is delete",
			body: edit(base, both(deleting, withFinalizers("other.io/finalizer", testFinalizer))),
			// kopf's deletion cause carries the stored and the current essence.
			want: causes.Delete, wantOldReplicas: int64(3), wantNewReplicas: int64(3),
		},
		{
			name: "deletion beats a missing diff-base",
			body: edit(fresh, both(deleting, withFinalizers(testFinalizer))),
			want: causes.Delete, wantOldIsNil: true, wantDiff: createDiff,
		},
		{
			name: "deletion beats a spec change",
			body: edit(base, both(deleting, withFinalizers(testFinalizer), func(b map[string]any) {
				at(b, "spec")["replicas"] = int64(9)
			})),
			want: causes.Delete, wantOldReplicas: int64(3), wantNewReplicas: int64(9),
			wantDiff: []string{`change spec.replicas: 3 -> 9`},
		},
		{
			name:  "deletion beats resume",
			body:  edit(base, both(deleting, withFinalizers(testFinalizer))),
			facts: objectFacts{noticedByListing: true},
			want:  causes.Delete, wantOldReplicas: int64(3),
		},
		{
			name: "an empty deletionTimestamp is no deletion",
			body: edit(base, func(b map[string]any) { at(b, "metadata")["deletionTimestamp"] = "" }),
			want: causes.Noop,
		},

		// Creation: no diff-base yet.
		{
			name:         "no diff-base is create, the whole essence added",
			body:         fresh,
			want:         causes.Create,
			wantDiff:     createDiff,
			wantOldIsNil: true, wantNewReplicas: int64(3),
		},
		{
			name:         "no diff-base is create even when noticed at startup (creation never mixes with resume)",
			body:         fresh,
			facts:        objectFacts{noticedByListing: true},
			want:         causes.Create,
			wantDiff:     createDiff,
			wantOldIsNil: true,
		},
		{
			name:         "our finalizer without a diff-base is still create",
			body:         edit(fresh, withFinalizers(testFinalizer)),
			want:         causes.Create,
			wantDiff:     createDiff,
			wantOldIsNil: true,
		},

		// Nothing that counts changed.
		{
			name: "unchanged since handled is noop",
			body: base,
			want: causes.Noop, wantOldReplicas: int64(3), wantNewReplicas: int64(3),
		},
		{
			name: "only status changed is noop",
			body: edit(base, func(b map[string]any) {
				b["status"] = map[string]any{"ready": true, "conditions": []any{map[string]any{"type": "Ready"}}}
			}),
			want: causes.Noop,
		},
		{
			name: "status removed is noop",
			body: edit(base, func(b map[string]any) { delete(b, "status") }),
			want: causes.Noop,
		},
		{
			name: "the operator's progress annotation is noop",
			body: edit(base, func(b map[string]any) {
				p := state.NewPatch()
				now := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
				progress.Store(b, p, "on_create", state.HandlerRecord{Started: &now, Retries: 1, Message: "boom"})
				for k, v := range mergePatched(b, p.Map()) {
					b[k] = v
				}
			}),
			want: causes.Noop,
		},
		{
			name: "any annotation under the operator's prefix is noop",
			body: edit(base, func(b map[string]any) {
				at(b, "metadata", "annotations")[testPrefix+"/touch"] = "2024-01-01T00:00:01Z"
			}),
			want: causes.Noop,
		},
		{
			name: "kubectl last-applied annotation is noop",
			body: edit(base, func(b map[string]any) {
				at(b, "metadata", "annotations")["kubectl.kubernetes.io/last-applied-configuration"] = `{"spec":{"replicas":3}}`
			}),
			want: causes.Noop,
		},
		{
			name: "resourceVersion, generation and managedFields changed is noop",
			body: edit(base, func(b map[string]any) {
				m := at(b, "metadata")
				m["resourceVersion"] = "1042"
				m["generation"] = int64(7)
				m["managedFields"] = []any{map[string]any{"manager": "luaop", "operation": "Update"}}
			}),
			want: causes.Noop,
		},
		{
			name: "our finalizer added is noop",
			body: edit(base, withFinalizers(testFinalizer)),
			want: causes.Noop,
		},
		{
			name: "apiVersion and kind are not part of the essence",
			body: edit(base, func(b map[string]any) { b["apiVersion"] = "example.com/v2" }),
			want: causes.Noop,
		},
		{
			name: "empty labels map equals the stored absence of labels",
			body: edit(handled(t, edit(fresh, func(b map[string]any) { delete(at(b, "metadata"), "labels") })),
				func(b map[string]any) { at(b, "metadata")["labels"] = map[string]any{} }),
			want: causes.Noop,
		},

		// Resume: no diff, noticed in the initial listing, not handled since start.
		{
			name:  "unchanged and noticed at startup is resume",
			body:  base,
			facts: objectFacts{noticedByListing: true},
			want:  causes.Resume, wantOldReplicas: int64(3), wantNewReplicas: int64(3),
		},
		{
			name: "only status changed and noticed at startup is resume",
			body: edit(base, func(b map[string]any) {
				b["status"] = map[string]any{"ready": true}
			}),
			facts: objectFacts{noticedByListing: true},
			want:  causes.Resume,
		},
		{
			name:  "resume already handled is noop",
			body:  base,
			facts: objectFacts{noticedByListing: true, resumeIsHandled: true},
			want:  causes.Noop,
		},
		{
			name:  "not noticed at startup is noop even if never resumed",
			body:  base,
			facts: objectFacts{resumeIsHandled: false},
			want:  causes.Noop,
		},

		// Updates.
		{
			name: "spec field changed is update",
			body: edit(base, func(b map[string]any) { at(b, "spec")["replicas"] = int64(5) }),
			want: causes.Update, wantDiff: []string{"change spec.replicas: 3 -> 5"},
			wantOldReplicas: int64(3), wantNewReplicas: int64(5),
		},
		{
			name:  "spec change of an object noticed at startup is update, not resume",
			body:  edit(base, func(b map[string]any) { at(b, "spec")["image"] = "nginx:1.26" }),
			facts: objectFacts{noticedByListing: true},
			want:  causes.Update, wantDiff: []string{`change spec.image: "nginx:1.25" -> "nginx:1.26"`},
			wantOldReplicas: int64(3), wantNewReplicas: int64(3),
		},
		{
			name: "spec field added and another removed",
			body: edit(base, func(b map[string]any) {
				delete(at(b, "spec"), "image")
				at(b, "spec")["paused"] = true
			}),
			want: causes.Update,
			wantDiff: []string{
				`remove spec.image: "nginx:1.25"`,
				"add spec.paused: true",
			},
		},
		{
			name: "nested field changed",
			body: edit(base, func(b map[string]any) { at(b, "spec", "tuning")["ratio"] = 0.75 }),
			want: causes.Update, wantDiff: []string{"change spec.tuning.ratio: 0.5 -> 0.75"},
		},
		{
			name: "a list is compared as a whole",
			body: edit(base, func(b map[string]any) { at(b, "spec")["ports"] = []any{int64(80), int64(8443)} }),
			want: causes.Update, wantDiff: []string{"change spec.ports: [80,443] -> [80,8443]"},
		},
		{
			name: "a new top-level field is update",
			body: edit(base, func(b map[string]any) { b["data"] = map[string]any{"key": "value"} }),
			want: causes.Update, wantDiff: []string{`add data: {"key":"value"}`},
		},
		{
			name: "label changed is update",
			body: edit(base, func(b map[string]any) { at(b, "metadata", "labels")["app"] = "other" }),
			want: causes.Update, wantDiff: []string{`change metadata.labels.app: "demo" -> "other"`},
		},
		{
			name: "label added is update",
			body: edit(base, func(b map[string]any) { at(b, "metadata", "labels")["tier"] = "web" }),
			want: causes.Update, wantDiff: []string{`add metadata.labels.tier: "web"`},
		},
		{
			name: "all labels removed is update",
			body: edit(base, func(b map[string]any) { delete(at(b, "metadata"), "labels") }),
			want: causes.Update, wantDiff: []string{`remove metadata.labels: {"app":"demo"}`},
		},
		{
			name: "a foreign annotation changed is update",
			body: edit(base, func(b map[string]any) { at(b, "metadata", "annotations")["team"] = "red" }),
			want: causes.Update, wantDiff: []string{`change metadata.annotations.team: "blue" -> "red"`},
		},
		{
			name: "another operator's annotation is a change for us",
			body: edit(base, func(b map[string]any) {
				at(b, "metadata", "annotations")["other.io/last-handled-configuration"] = "{}"
			}),
			want: causes.Update, wantDiff: []string{`add metadata.annotations.other.io/last-handled-configuration: "{}"`},
		},

		// A diff-base that cannot be read: treated as new, with the problem reported.
		{
			name: "corrupt diff-base is create with a problem",
			body: edit(base, func(b map[string]any) {
				at(b, "metadata", "annotations")[state.LastHandledKey(testPrefix)] = `{"spec": {"replicas": 3`
			}),
			want: causes.Create, wantProblem: true, wantOldIsNil: true, wantNewReplicas: int64(3),
			wantDiff: createDiff,
		},
		{
			name: "diff-base that is not a JSON object is create with a problem",
			body: edit(base, func(b map[string]any) {
				at(b, "metadata", "annotations")[state.LastHandledKey(testPrefix)] = `[1, 2]`
			}),
			facts: objectFacts{noticedByListing: true},
			want:  causes.Create, wantProblem: true, wantOldIsNil: true,
			wantDiff: createDiff,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := state.DeepCopyValue(tt.body)
			got := detectWithAnnotations(tt.body, testPrefix, testFinalizer, tt.facts)

			if got.Reason != tt.want {
				t.Fatalf("reason = %q, want %q (diff %v)", got.Reason, tt.want, diffText(got.Diff))
			}
			if gotDiff := diffText(got.Diff); !slices.Equal(gotDiff, tt.wantDiff) && !(len(gotDiff) == 0 && len(tt.wantDiff) == 0) {
				t.Errorf("diff =\n  %q\nwant\n  %q", gotDiff, tt.wantDiff)
			}
			if (got.diffBaseProblem != nil) != tt.wantProblem {
				t.Errorf("diffBaseProblem = %v, want problem: %v", got.diffBaseProblem, tt.wantProblem)
			}
			if tt.wantProblem && !strings.Contains(got.diffBaseProblem.Error(), state.LastHandledKey(testPrefix)) {
				t.Errorf("diffBaseProblem %q does not name the annotation %s", got.diffBaseProblem, state.LastHandledKey(testPrefix))
			}
			if tt.wantOldIsNil && got.Old != nil {
				t.Errorf("old = %v, want nil", got.Old)
			}
			if tt.wantOldReplicas != nil {
				if v, _ := state.Resolve(got.Old, []string{"spec", "replicas"}); !state.ValuesEqual(v, tt.wantOldReplicas) {
					t.Errorf("old spec.replicas = %v, want %v", v, tt.wantOldReplicas)
				}
			}
			if tt.wantNewReplicas != nil {
				if v, _ := state.Resolve(got.New, []string{"spec", "replicas"}); !state.ValuesEqual(v, tt.wantNewReplicas) {
					t.Errorf("new spec.replicas = %v, want %v", v, tt.wantNewReplicas)
				}
			}
			switch got.Reason {
			case causes.Create, causes.Update, causes.Resume, causes.Noop, causes.Delete:
				// new is the essence of the current body, without what is not part of it.
				if !state.ValuesEqual(got.New, state.Essence(tt.body, testPrefix)) {
					t.Errorf("new = %v, want the current essence", got.New)
				}
				for _, k := range []string{"status", "apiVersion", "kind"} {
					if _, ok := got.New.(map[string]any)[k]; ok {
						t.Errorf("new essence contains %q", k)
					}
				}
			case causes.Free:
				if got.New != nil || len(got.Diff) != 0 {
					t.Errorf("%s cause carries new=%v diff=%v", got.Reason, got.New, diffText(got.Diff))
				}
			}
			if !state.ValuesEqual(before, tt.body) {
				t.Errorf("detectChangeCause modified the body")
			}
		})
	}
}

// The diff-base written after an update makes the same body a noop, and a later
// change an update relative to it, not to the original.
func TestDetectChangeCauseAfterHandlingAnUpdate(t *testing.T) {
	v1 := handled(t, widget())
	v2 := edit(v1, func(b map[string]any) { at(b, "spec")["replicas"] = int64(5) })
	if got := detectWithAnnotations(v2, testPrefix, testFinalizer, objectFacts{}); got.Reason != causes.Update {
		t.Fatalf("v2: reason = %q, want update", got.Reason)
	}
	v2handled := handled(t, v2)
	v3 := edit(v2handled, func(b map[string]any) { at(b, "spec")["replicas"] = int64(7) })

	tests := []struct {
		name     string
		body     map[string]any
		want     causes.Reason
		wantDiff []string
	}{
		{name: "handled update is noop", body: v2handled, want: causes.Noop},
		{name: "next change is relative to the new base", body: v3, want: causes.Update, wantDiff: []string{"change spec.replicas: 5 -> 7"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := detectWithAnnotations(tt.body, testPrefix, testFinalizer, objectFacts{})
			if got.Reason != tt.want {
				t.Fatalf("reason = %q, want %q", got.Reason, tt.want)
			}
			if gotDiff := diffText(got.Diff); !slices.Equal(gotDiff, tt.wantDiff) && !(len(gotDiff) == 0 && len(tt.wantDiff) == 0) {
				t.Errorf("diff = %q, want %q", gotDiff, tt.wantDiff)
			}
		})
	}
}

func TestHasFinalizer(t *testing.T) {
	tests := []struct {
		name string
		body map[string]any
		want bool
	}{
		{name: "no metadata", body: map[string]any{}, want: false},
		{name: "no finalizers", body: widget(), want: false},
		{name: "empty list", body: edit(widget(), withFinalizers()), want: false},
		{name: "only foreign", body: edit(widget(), withFinalizers("other.io/finalizer")), want: false},
		{name: "ours alone", body: edit(widget(), withFinalizers(testFinalizer)), want: true},
		{name: "ours among others", body: edit(widget(), withFinalizers("a/x", testFinalizer, "b/y")), want: true},
		{name: "a prefix of ours is not ours", body: edit(widget(), withFinalizers(testPrefix)), want: false},
		{name: "another operator's finalizer is not ours", body: edit(widget(), withFinalizers("other.dev/finalizer")), want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := hasFinalizer(tt.body, testFinalizer); got != tt.want {
				t.Errorf("hasFinalizer = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFinalizersWith(t *testing.T) {
	tests := []struct {
		name    string
		current []string // nil: no finalizers field
		present bool
		want    []any
	}{
		{name: "add to none", current: nil, present: true, want: []any{testFinalizer}},
		{name: "add to empty", current: []string{}, present: true, want: []any{testFinalizer}},
		{name: "add keeps others in order", current: []string{"a/x", "b/y"}, present: true, want: []any{"a/x", "b/y", testFinalizer}},
		{name: "add when already last is unchanged", current: []string{"a/x", testFinalizer}, present: true, want: []any{"a/x", testFinalizer}},
		{name: "remove the only one gives an empty list", current: []string{testFinalizer}, present: false, want: []any{}},
		{name: "remove keeps others in order", current: []string{"a/x", testFinalizer, "b/y"}, present: false, want: []any{"a/x", "b/y"}},
		{name: "remove when absent is unchanged", current: []string{"a/x", "b/y"}, present: false, want: []any{"a/x", "b/y"}},
		{name: "remove from none gives an empty list", current: nil, present: false, want: []any{}},
		{name: "duplicates of ours collapse", current: []string{testFinalizer, "a/x", testFinalizer}, present: false, want: []any{"a/x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := widget()
			if tt.current != nil {
				body = edit(body, withFinalizers(tt.current...))
			}
			before := state.DeepCopyValue(body)

			got := finalizersWith(body, testFinalizer, tt.present)
			if got == nil {
				t.Fatalf("finalizersWith returned nil; a merge patch needs [] to clear the list")
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("finalizersWith = %v, want %v", got, tt.want)
			}
			if !state.ValuesEqual(before, body) {
				t.Errorf("finalizersWith modified the body")
			}

			// Applied as a merge patch, the result has our finalizer exactly as asked.
			patched := mergePatched(body, map[string]any{"metadata": map[string]any{"finalizers": got}})
			if hasFinalizer(patched, testFinalizer) != tt.present {
				t.Errorf("after patching, hasFinalizer = %v, want %v", !tt.present, tt.present)
			}
			// Idempotent: doing it again changes nothing.
			if again := finalizersWith(patched, testFinalizer, tt.present); !slices.Equal(again, got) {
				t.Errorf("second finalizersWith = %v, want %v", again, got)
			}
		})
	}
}
