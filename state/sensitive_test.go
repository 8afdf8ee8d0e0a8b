package state

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func secret(uid string, data map[string]any) map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": "s", "namespace": "ns", "uid": uid},
		"data":     data,
	}
}

// A Secret's values never reach its stored diff-base; what changed is still found
// per key, and only a changed or removed value is seen as its digest.
func TestSecretValuesAreStoredAsDigests(t *testing.T) {
	storage := NewDigestingDiffBase(NewAnnotationsDiffBase("luaop.dev"), nil, "luaop.dev/held-back")
	handled := secret("u1", map[string]any{"password": "aHVudGVyMg==", "user": "YWRtaW4="})
	p := NewPatch()
	if err := storage.Store(handled, p, Essence(handled, "luaop.dev")); err != nil {
		t.Fatal(err)
	}
	stored := applyMergePatch(handled, p.Map())
	raw := annotations(stored)[LastHandledKey("luaop.dev")].(string)
	for _, value := range []string{"aHVudGVyMg==", "YWRtaW4="} {
		if strings.Contains(raw, value) {
			t.Fatalf("the annotation holds the value %s: %s", value, raw)
		}
	}
	tests := []struct {
		name    string
		data    map[string]any
		changed []string // keys whose old value is a digest
	}{
		{"nothing changed", map[string]any{"password": "aHVudGVyMg==", "user": "YWRtaW4="}, nil},
		{"one key changed", map[string]any{"password": "bmV3", "user": "YWRtaW4="}, []string{"password"}},
		{"one key removed", map[string]any{"user": "YWRtaW4="}, []string{"password"}},
		{"one key added", map[string]any{"password": "aHVudGVyMg==", "user": "YWRtaW4=", "token": "dA=="}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := applyMergePatch(stored, map[string]any{"data": nil})
			now["data"] = tt.data
			old, found, err := storage.Fetch(now)
			if err != nil || !found {
				t.Fatalf("fetch: %v %v", found, err)
			}
			oldData, _ := old["data"].(map[string]any)
			for key, v := range oldData {
				digest := slices.Contains(tt.changed, key)
				if s, _ := v.(string); isDigest(s) != digest {
					t.Errorf("old data.%s = %v, want a digest: %v", key, v, digest)
				}
				if !digest && v != tt.data[key] {
					t.Errorf("old data.%s = %v, want the unchanged value %v", key, v, tt.data[key])
				}
			}
			var changedKeys []string
			for _, d := range Compare(old, Essence(now, "luaop.dev")) {
				changedKeys = append(changedKeys, strings.Join(d.Path, "."))
			}
			want := len(tt.changed)
			if tt.name == "one key added" {
				want = 1
			}
			if len(changedKeys) != want {
				t.Errorf("changes %v, want %d", changedKeys, want)
			}
		})
	}
}

// The digests are keyed by the object: equal values of two Secrets do not show as
// equal digests, and one Secret's digest does not restore another's value.
func TestDigestsDifferPerObject(t *testing.T) {
	a := DigestSensitive(secret("u1", nil), map[string]any{"data": map[string]any{"k": "dg=="}}, nil)
	b := DigestSensitive(secret("u2", nil), map[string]any{"data": map[string]any{"k": "dg=="}}, nil)
	if reflect.DeepEqual(a, b) {
		t.Fatalf("two objects' digests of one value are equal: %v", a)
	}
	restored := restoreAt(a, secret("u2", map[string]any{"k": "dg=="}), []string{"data"}, digestKey(secret("u2", nil)))
	if v := restored["data"].(map[string]any)["k"]; v == "dg==" {
		t.Fatal("another object's digest restored the value")
	}
}

// A diff-base stored with the values as they are (an older luaop, kopf) is read as
// it is, and Refresh rewrites it with digests; a refreshed one is left alone. Other
// kinds and declared paths: only the declared paths are digested.
func TestRefreshRewritesValuesStoredAsTheyAre(t *testing.T) {
	obj := secret("u1", map[string]any{"password": "aHVudGVyMg=="})
	legacy := NewPatch()
	if err := NewAnnotationsDiffBase("luaop.dev").Store(obj, legacy, Essence(obj, "luaop.dev")); err != nil {
		t.Fatal(err)
	}
	obj = applyMergePatch(obj, legacy.Map())
	storage := NewDigestingDiffBase(NewSmartDiffBase(NewAnnotationsDiffBase("luaop.dev"), NewStatusDiffBase("luaop_dev")), nil, "luaop.dev/held-back")
	old, _, _ := storage.Fetch(obj)
	if d := Compare(old, Essence(obj, "luaop.dev")); len(d) != 0 {
		t.Fatalf("a legacy diff-base reads as changes: %v", d)
	}
	refresher := storage.(interface {
		Refresh(map[string]any, *Patch) (bool, error)
	})
	p := NewPatch()
	if wrote, err := refresher.Refresh(obj, p); !wrote || err != nil {
		t.Fatalf("refresh of a legacy diff-base: wrote=%v err=%v", wrote, err)
	}
	obj = applyMergePatch(obj, p.Map())
	if raw, _ := json.Marshal(obj["metadata"]); strings.Contains(string(raw), "aHVudGVyMg==") {
		t.Fatalf("the value is still in the metadata: %s", raw)
	}
	if wrote, _ := refresher.Refresh(obj, NewPatch()); wrote {
		t.Fatal("a refreshed diff-base is refreshed again")
	}

	widget := map[string]any{"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"uid": "u3"}, "spec": map[string]any{"password": "p", "size": int64(1)}}
	got := DigestSensitive(widget, Essence(widget, "luaop.dev"), [][]string{{"spec", "password"}})
	spec := got["spec"].(map[string]any)
	if s, _ := spec["password"].(string); !isDigest(s) || spec["size"] != int64(1) {
		t.Fatalf("declared path: %v", spec)
	}
	if plain := DigestSensitive(widget, Essence(widget, "luaop.dev"), nil); !reflect.DeepEqual(plain, Essence(widget, "luaop.dev")) {
		t.Fatalf("a Widget without declared paths is changed: %v", plain)
	}
}

// A held-back value (a field handler out of its filter keeps the value it last
// handled in the diff-base) of a Secret is stored as a digest too, and read back as
// the value where the object still has it.
func TestHeldBackValuesOfASecretAreDigests(t *testing.T) {
	storage := NewDigestingDiffBase(NewAnnotationsDiffBase("luaop.dev"), nil, "luaop.dev/held-back")
	obj := secret("u1", map[string]any{"password": "aHVudGVyMg==", "user": "YWRtaW4="})
	essence := Essence(obj, "luaop.dev")
	essence["luaop.dev/held-back"] = map[string]any{
		"pw":   map[string]any{"value": "b2xk"},     // a value the object no longer has
		"user": map[string]any{"value": "YWRtaW4="}, // one it still has
		"gone": map[string]any{},                    // absent: nothing to hide
	}
	p := NewPatch()
	if err := storage.Store(obj, p, essence); err != nil {
		t.Fatal(err)
	}
	stored := applyMergePatch(obj, p.Map())
	raw := annotations(stored)[LastHandledKey("luaop.dev")].(string)
	if strings.Contains(raw, "b2xk") || strings.Contains(raw, "YWRtaW4=") {
		t.Fatalf("a held-back value is stored as it is: %s", raw)
	}
	got, _, err := storage.Fetch(stored)
	if err != nil {
		t.Fatal(err)
	}
	held := got["luaop.dev/held-back"].(map[string]any)
	if v := held["user"].(map[string]any)["value"]; v != "YWRtaW4=" {
		t.Errorf("a held value the object still has reads %v", v)
	}
	if v, _ := held["pw"].(map[string]any)["value"].(string); !isDigest(v) {
		t.Errorf("a held value the object no longer has reads %v, want its digest", v)
	}
	if _, present := held["gone"].(map[string]any)["value"]; present {
		t.Errorf("an absent held value gained one: %v", held["gone"])
	}
}
