package processing

import (
	"reflect"
	"testing"
)

// The /status write is a JSON patch: keys holding "~" or "/" (a label-like key
// "example.com/owner") must be escaped as RFC 6901 says, or the patch names another
// path.
func TestStatusOpsEscapeKeys(t *testing.T) {
	body := map[string]any{"status": map[string]any{"a~b": "old"}}
	patch := map[string]any{"status": map[string]any{
		"a~b":               "new",
		"example.com/owner": "me",
		"plain":             nil, // absent: skipped
	}}
	want := []map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": "u1"},
		{"op": "add", "path": "/status/a~0b", "value": "new"},
		{"op": "test", "path": "/status/example.com~1owner", "value": nil},
		{"op": "add", "path": "/status/example.com~1owner", "value": "me"},
	}
	if got := statusOps(body, patch, "u1"); !reflect.DeepEqual(got, want) {
		t.Errorf("statusOps =\n%v\nwant\n%v", got, want)
	}
	for in, want := range map[string]string{"": "", "plain": "plain", "~": "~0", "/": "~1", "~/": "~0~1", "a/~1": "a~1~01"} {
		if got := escapePointerToken(in); got != want {
			t.Errorf("escapePointerToken(%q) = %q, want %q", in, got, want)
		}
	}
}
