package state

import (
	"math/rand/v2"
	"testing"
)

// randomValue builds a small JSON-like value whose keys come from a tiny alphabet, so that two
// random objects overlap and produce every kind of diff item.
func randomValue(r *rand.Rand, depth int) any {
	switch n := r.IntN(10); {
	case n == 0:
		return nil
	case n == 1:
		return r.IntN(3) == 0
	case n == 2:
		return int64(r.IntN(4))
	case n == 3:
		return float64(r.IntN(4)) // often equal to an int64 of another object
	case n == 4:
		return float64(r.IntN(4)) + 0.5
	case n == 5:
		return string(rune('a' + r.IntN(3)))
	case n == 6:
		l := make([]any, r.IntN(3))
		for i := range l {
			l[i] = randomValue(r, depth+1)
		}
		return l
	default:
		if depth > 3 {
			return int64(r.IntN(2))
		}
		return randomMap(r, depth+1)
	}
}

func randomMap(r *rand.Rand, depth int) map[string]any {
	m := map[string]any{}
	for range r.IntN(4) {
		m[string(rune('a'+r.IntN(4)))] = randomValue(r, depth)
	}
	return m
}

// FuzzCompareApply checks the property tying the package together: the diff of a and b,
// turned into a merge patch and applied to a, gives b.
func FuzzCompareApply(f *testing.F) {
	for i := range uint64(16) {
		f.Add(i, i*7919+1)
	}
	f.Fuzz(func(t *testing.T, seedA, seedB uint64) {
		a := randomMap(rand.New(rand.NewPCG(seedA, 1)), 0)
		b := randomMap(rand.New(rand.NewPCG(seedB, 2)), 0)
		aJSON := mustJSON(t, a)
		d := Compare(a, b)
		got := applyMergePatch(a, mergePatchOf(d))
		if !ValuesEqual(got, b) {
			t.Fatalf("a=%s b=%s\ndiff: %v\npatch: %s\ngot: %s", aJSON, mustJSON(t, b), d,
				mustJSON(t, mergePatchOf(d)), mustJSON(t, got))
		}
		if len(Compare(got, b)) != 0 {
			t.Fatal("Compare disagrees with ValuesEqual")
		}
		if mustJSON(t, a) != aJSON {
			t.Fatal("a was modified")
		}
		// Reducing to any top-level key equals comparing that key's values directly.
		for _, k := range []string{"a", "b"} {
			want := Compare(a[k], b[k])
			if r := d.Reduce([]string{k}); diffString(r) != diffString(want) {
				t.Fatalf("Reduce(%s) = %v, want %v", k, r, want)
			}
		}
	})
}
