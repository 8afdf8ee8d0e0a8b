package state

import "testing"

func TestEscapePointerToken(t *testing.T) {
	for in, want := range map[string]string{
		"": "", "plain": "plain", "~": "~0", "/": "~1", "~/": "~0~1", "a/~1": "a~1~01",
		"example.org/name": "example.org~1name", "a~b": "a~0b",
	} {
		if got := EscapePointerToken(in); got != want {
			t.Errorf("EscapePointerToken(%q) = %q, want %q", in, got, want)
		}
	}
}
