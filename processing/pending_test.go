package processing

import (
	"fmt"
	"testing"
)

// A parent's message names a few pending subhandlers and counts the rest: it is
// written at every cycle, and 20,000 ids would not fit in the annotations.
func TestPendingSummaryNamesAFewAndCountsTheRest(t *testing.T) {
	many := make([]string, 20000)
	for i := range many {
		many[i] = fmt.Sprintf("parent/child-%05d", i)
	}
	for _, c := range []struct {
		ids  []string
		want string
	}{
		{[]string{"a"}, "a"},
		{[]string{"a", "b", "c", "d", "e"}, "a, b, c, d, e"},
		{[]string{"a", "b", "c", "d", "e", "f", "g"}, "a, b, c, d, e and 2 more"},
		{many, "parent/child-00000, parent/child-00001, parent/child-00002, parent/child-00003, parent/child-00004 and 19995 more"},
	} {
		if got := pendingSummary(c.ids); got != c.want {
			t.Errorf("pendingSummary(%d ids) = %q, want %q", len(c.ids), got, c.want)
		}
	}
}
