package handling

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/luaop/luaop/processing/causes"
)

// What a progress record keeps and a final failure quotes: the error's text
// without the retry a TemporaryError asks for, wherever a wrapper puts it.
func TestErrorMessage(t *testing.T) {
	tmp := &causes.TemporaryError{Message: "not ready", Delay: 10 * time.Second}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"no error", nil, ""},
		{"an arbitrary error", errors.New("boom"), "boom"},
		{"a TemporaryError", tmp, "not ready"},
		{"wrapped, the wrapper's text first", fmt.Errorf("calling the API: %w", tmp), "calling the API: not ready"},
		{"wrapped, the wrapper's text after it", fmt.Errorf("%w: the pod is pending", tmp), "not ready: the pod is pending"},
		{"joined with another error", errors.Join(tmp, errors.New("and more")), "not ready\nand more"},
		{"a permanent error", &causes.PermanentError{Message: "never"}, (&causes.PermanentError{Message: "never"}).Error()},
	} {
		if got := ErrorMessage(tc.err); got != tc.want {
			t.Errorf("%s: ErrorMessage = %q, want %q", tc.name, got, tc.want)
		}
	}
}
