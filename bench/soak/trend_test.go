package main

import (
	"testing"
	"time"
)

// The soak's "memory flat" check: what it compares, and what it leaves out.
func TestMemoryTrend(t *testing.T) {
	const mb = 1 << 20
	// series: one sample a minute over a 20-minute churn, value(minute) in MiB for
	// RSS, heap and stacks alike; bad minutes are failed readings (zeros).
	series := func(value func(minute int) float64, bad ...int) []sample {
		var out []sample
		for m := 0; m <= 20; m++ {
			v := value(m)
			smp := sample{at: time.Duration(m) * time.Minute, rss: int64(v * mb), heap: v * mb, stacks: v * mb, memOK: true}
			for _, b := range bad {
				if b == m {
					smp = sample{at: smp.at}
				}
			}
			out = append(out, smp)
		}
		return out
	}
	cases := []struct {
		name     string
		samples  []sample
		ok, flat bool
	}{
		{"flat", series(func(int) float64 { return 100 }), true, true},
		{"warms up, then flat", series(func(m int) float64 { return 100 + 30*min(float64(m), 8)/8 }), true, true},
		{"keeps growing", series(func(m int) float64 { return 100 + 2*float64(m) }), true, false},
		{"small and noisy (stacks of 2 MiB swinging by 0.2 MiB)", series(func(m int) float64 { return 2 + 0.2*float64(m%2) + 0.1*float64(m/15) }), true, true},
		{"small but growing past the floor", series(func(m int) float64 { return 2 + 0.25*float64(m) }), true, false},
		{"failed readings left out", series(func(int) float64 { return 100 }, 11, 16, 17), true, true},
		{"too few readings", series(func(int) float64 { return 100 }, 10, 11, 12, 13, 14), false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr, ok := memoryTrend(c.samples, 20*time.Minute)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if ok && tr.flat() != c.flat {
				t.Errorf("flat = %v, want %v (%s)", tr.flat(), c.flat, tr)
			}
		})
	}
}
