package state

import (
	"errors"
	"strings"
	"testing"
)

const testPrefix = "luaop.example.com"

func TestEssence(t *testing.T) {
	tests := []struct {
		name string
		obj  string
		want string
	}{
		{"drops status, kind, apiVersion and most metadata",
			`{"apiVersion":"v1","kind":"X","metadata":{"name":"n","namespace":"ns","uid":"u","resourceVersion":"7","generation":3,"finalizers":["f"],"managedFields":[{}]},"spec":{"a":1},"status":{"s":1}}`,
			`{"spec":{"a":1}}`},
		{"keeps labels and foreign annotations",
			`{"metadata":{"labels":{"app":"x"},"annotations":{"team":"a"}},"spec":{}}`,
			`{"metadata":{"annotations":{"team":"a"},"labels":{"app":"x"}},"spec":{}}`},
		{"drops own annotations and last-applied",
			`{"metadata":{"annotations":{"luaop.example.com/last-handled-configuration":"{}","luaop.example.com/h1":"{}","kubectl.kubernetes.io/last-applied-configuration":"{}","other.example.com/x":"y"}}}`,
			`{"metadata":{"annotations":{"other.example.com/x":"y"}}}`},
		{"a longer prefix that merely starts the same is foreign",
			`{"metadata":{"annotations":{"luaop.example.com.evil/x":"y"}}}`,
			`{"metadata":{"annotations":{"luaop.example.com.evil/x":"y"}}}`},
		{"drops the shard label only (sharding across replicas moves objects: not a change)",
			`{"metadata":{"labels":{"luaop.example.com/shard":"r1","luaop.example.com/other":"x","app":"y"}}}`,
			`{"metadata":{"labels":{"app":"y","luaop.example.com/other":"x"}}}`},
		{"only the shard label leaves no labels", `{"metadata":{"labels":{"luaop.example.com/shard":"r1"}},"spec":1}`, `{"spec":1}`},
		{"empty labels equal no labels", `{"metadata":{"labels":{},"annotations":{}},"spec":1}`, `{"spec":1}`},
		{"only own annotations leave no metadata",
			`{"metadata":{"annotations":{"luaop.example.com/x":"1"}},"data":{"k":"v"}}`, `{"data":{"k":"v"}}`},
		{"top-level nil dropped", `{"spec":null,"data":{"a":null}}`, `{"data":{"a":null}}`},
		{"no metadata at all", `{"spec":{"x":[1,2]}}`, `{"spec":{"x":[1,2]}}`},
		{"empty object", `{}`, `{}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := obj(t, tt.obj)
			e := Essence(o, testPrefix)
			got, err := EncodeEssence(e)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("got %s, want %s", got, tt.want)
			}
			before := mustJSON(t, o)
			mutateAll(e)
			if mustJSON(t, o) != before {
				t.Fatal("the essence shares state with the object")
			}
		})
	}
}

func TestEncodeEssence(t *testing.T) {
	tests := []struct {
		name    string
		essence map[string]any
		want    string
		wantErr bool
	}{
		{"sorted keys", map[string]any{"b": int64(1), "a": map[string]any{"z": true, "y": nil}}, `{"a":{"y":null,"z":true},"b":1}`, false},
		{"float and int agree", map[string]any{"a": 3.0, "b": int64(3)}, `{"a":3,"b":3}`, false},
		{"no html escaping", map[string]any{"a": "<&>"}, `{"a":"<&>"}`, false},
		{"nil essence", nil, `null`, false},
		{"unencodable", map[string]any{"f": func() {}}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EncodeEssence(tt.essence)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("got %q, %v; want %q (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestStoredEssence(t *testing.T) {
	key := LastHandledKey(testPrefix)
	tests := []struct {
		name      string
		anno      any // nil: no annotation
		want      string
		wantFound bool
		wantErr   bool
	}{
		{"absent", nil, "null", false, false},
		{"valid", `{"spec":{"a":1,"b":1.5}}`, `{"spec":{"a":1,"b":1.5}}`, true, false},
		{"corrupt", `{"spec":`, "null", true, true},
		{"not an object", `[1]`, "null", true, true},
		{"json null", `null`, "null", true, true},
		{"trailing garbage", `{} {}`, "null", true, true},
		{"not a string", int64(5), "null", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := map[string]any{"metadata": map[string]any{"annotations": map[string]any{}}}
			if tt.anno != nil {
				o["metadata"].(map[string]any)["annotations"].(map[string]any)[key] = tt.anno
			}
			e, found, err := StoredEssence(o, testPrefix)
			if found != tt.wantFound || (err != nil) != tt.wantErr || mustJSON(t, e) != tt.want {
				t.Fatalf("got %s, %v, %v", mustJSON(t, e), found, err)
			}
			if err != nil && !strings.Contains(err.Error(), key) {
				t.Fatalf("error does not name the annotation: %v", err)
			}
		})
	}
	if _, ok := mustStored(t, map[string]any{"spec": int64(1)})["spec"].(int64); !ok {
		t.Fatal("integers must decode as int64, like client-go")
	}
}

func mustStored(t *testing.T, essence map[string]any) map[string]any {
	t.Helper()
	o := map[string]any{}
	p := NewPatch()
	if err := StoreEssence(o, p, testPrefix, essence); err != nil {
		t.Fatal(err)
	}
	e, found, err := StoredEssence(applyMergePatch(o, p.Map()), testPrefix)
	if !found || err != nil {
		t.Fatalf("stored essence not read back: %v %v", found, err)
	}
	return e
}

func TestStoreEssenceRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		obj  string
	}{
		{"simple", `{"apiVersion":"v1","kind":"X","metadata":{"name":"a"},"spec":{"size":3}}`},
		{"labels, annotations, nesting",
			`{"metadata":{"labels":{"a":"b"},"annotations":{"x":"<y>","luaop.example.com/h":"{}"}},"spec":{"l":[1,{"m":2.5}],"n":null},"data":{"k":"v"}}`},
		{"replaces an older diff-base",
			`{"metadata":{"annotations":{"luaop.example.com/last-handled-configuration":"{\"spec\":0}"}},"spec":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := obj(t, tt.obj)
			e := Essence(o, testPrefix)
			p := NewPatch()
			if err := StoreEssence(o, p, testPrefix, e); err != nil {
				t.Fatal(err)
			}
			after := applyMergePatch(o, p.Map())
			stored, found, err := StoredEssence(after, testPrefix)
			if !found || err != nil {
				t.Fatalf("found %v, err %v", found, err)
			}
			if d := Compare(stored, e); len(d) > 0 {
				t.Fatalf("round trip differs: %v", d)
			}
			// Storing the diff-base must not itself change the essence: that is how the
			// operator ignores its own writes.
			if d := Compare(e, Essence(after, testPrefix)); len(d) > 0 {
				t.Fatalf("storing changed the essence: %v", d)
			}
		})
	}
}

func TestStoreEssenceSizeLimit(t *testing.T) {
	key := LastHandledKey(testPrefix)
	// An essence {"spec":"xxx..."} encodes to len(`{"spec":""}`) + n bytes; the marker
	// annotation written with it counts too.
	overhead := len(key) + len(`{"spec":""}`) + len(ManagedKey(testPrefix)) + len("yes")
	big := func(n int) map[string]any { return map[string]any{"spec": strings.Repeat("x", n)} }
	withAnno := func(k string, n int) map[string]any {
		return map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: strings.Repeat("y", n)}}}
	}
	tests := []struct {
		name    string
		obj     map[string]any
		pending map[string]any // merged into the patch first
		essence map[string]any
		wantErr bool
	}{
		{"small", map[string]any{}, nil, big(10), false},
		{"exactly at the limit", map[string]any{}, nil, big(maxAnnotationsSize - overhead), false},
		{"one byte over", map[string]any{}, nil, big(maxAnnotationsSize - overhead + 1), true},
		{"other annotations count", withAnno("a", 1000), nil, big(maxAnnotationsSize - overhead - 1000), true},
		{"other annotations fit", withAnno("a", 1000), nil, big(maxAnnotationsSize - overhead - 1001), false},
		{"the old diff-base does not count", withAnno(key, 200000), nil, big(maxAnnotationsSize - overhead), false},
		{"annotations deleted by the patch do not count", withAnno("a", 1000),
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{"a": nil}}},
			big(maxAnnotationsSize - overhead), false},
		{"annotations added by the patch count", map[string]any{},
			map[string]any{"metadata": map[string]any{"annotations": map[string]any{"b": "zz"}}},
			big(maxAnnotationsSize - overhead - 2), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPatch()
			p.Merge(tt.pending)
			before := mustJSON(t, p.Map())
			err := StoreEssence(tt.obj, p, testPrefix, tt.essence)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, ErrDiffBaseTooLarge) {
					t.Fatalf("error does not wrap ErrDiffBaseTooLarge: %v", err)
				}
				if mustJSON(t, p.Map()) != before {
					t.Fatal("a failed store wrote into the patch")
				}
			} else if _, ok := p.Get([]string{"metadata", "annotations", key}); !ok {
				t.Fatal("the diff-base was not written")
			}
		})
	}
}

func TestLastHandledKey(t *testing.T) {
	if got := LastHandledKey("kopf.zalando.org"); got != "kopf.zalando.org/last-handled-configuration" {
		t.Fatal(got)
	}
}
