package processing

import "testing"

func TestVersionOlder(t *testing.T) {
	tests := []struct {
		name     string
		rv, than string
		want     bool
	}{
		// etcd revisions compare as numbers, not as strings.
		{name: "smaller number", rv: "41", than: "42", want: true},
		{name: "equal numbers", rv: "42", than: "42", want: false},
		{name: "greater number", rv: "43", than: "42", want: false},
		{name: "fewer digits is older", rv: "9", than: "10", want: true},
		{name: "more digits is newer", rv: "10", than: "9", want: false},
		{name: "leading zeros compare by value", rv: "010", than: "10", want: false},
		{name: "zero", rv: "0", than: "1", want: true},
		{name: "largest uint64", rv: "18446744073709551614", than: "18446744073709551615", want: true},
		{name: "largest uint64 is not older than itself minus one", rv: "18446744073709551615", than: "18446744073709551614", want: false},

		// Opaque versions: only equality is known, anything else counts as not there yet.
		{name: "equal opaque versions", rv: "abc", than: "abc", want: false},
		{name: "different opaque versions", rv: "abc", than: "abd", want: true},
		{name: "different opaque versions, other way round", rv: "abd", than: "abc", want: true},
		{name: "number against opaque", rv: "5", than: "v5", want: true},
		{name: "opaque against number", rv: "v5", than: "5", want: true},
		{name: "negative numbers are opaque", rv: "-1", than: "-1", want: false},
		{name: "beyond uint64 is opaque and compared for equality", rv: "18446744073709551616", than: "18446744073709551617", want: true},
		{name: "empty against a version", rv: "", than: "42", want: true},
		{name: "both empty", rv: "", than: "", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := versionOlder(tt.rv, tt.than); got != tt.want {
				t.Errorf("versionOlder(%q, %q) = %v, want %v", tt.rv, tt.than, got, tt.want)
			}
		})
	}
}

func TestVersionNewerComparesOnlyNumbers(t *testing.T) {
	tests := []struct {
		rv, than string
		want     bool
	}{
		{"11", "10", true},
		{"10", "10", false},
		{"9", "10", false},
		{"100", "99", true}, // as numbers, not strings
		{"b", "a", false},   // not comparable: never "newer"
		{"11", "", false},
		{"", "10", false},
	}
	for _, tt := range tests {
		if got := versionNewer(tt.rv, tt.than); got != tt.want {
			t.Errorf("versionNewer(%q, %q) = %v, want %v", tt.rv, tt.than, got, tt.want)
		}
	}
}
