package state

import "strings"

// EscapePointerToken escapes one JSON-pointer reference token (RFC 6901): "~" as
// "~0", "/" as "~1" (a map key in a JSON patch's path: an annotation's
// "example.org/name", a subhandler's "parent/child"). Keys rarely hold either, so
// the common case allocates nothing.
func EscapePointerToken(k string) string {
	if !strings.ContainsAny(k, "~/") {
		return k
	}
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
