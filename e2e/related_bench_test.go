package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/luaop/luaop/testcluster"
)

// BenchmarkReplicatorBurst: examples/replicator.lua holding 1,000 copies (S sources
// copied into 1,000/S namespaces) while every copy is edited by hand at once (a
// changed value and an added key, 32 writers). It prints how long each copy took to
// be healed, from the edit's answer to the watch event of the healed copy
// (percentiles, max; LUAOP_BENCH_HEAL_TIMES=FILE writes every copy's), and the
// operator's requests during the burst (no LIST). Shapes: 10 sources x 100
// namespaces (each source's handler gets 100 related changes, coalesced) and 1 x
// 1,000 (one parent, 1,000 children); LUAOP_BENCH_SOURCES=1,10 chooses. One
// measurement per run, whatever b.N. Run: make bench-related.
func BenchmarkReplicatorBurst(b *testing.B) {
	env.Require(b)
	for _, sources := range burstShapes(b) {
		b.Run(fmt.Sprintf("copies=%d/sources=%d", burstCopies, sources), func(b *testing.B) { replicatorBurst(b, sources, burstCopies/sources) })
	}
}

// burstCopies: 1,000, or LUAOP_BENCH_COPIES (a smaller run while iterating).
var burstCopies = func() int {
	if n, err := strconv.Atoi(os.Getenv("LUAOP_BENCH_COPIES")); err == nil && n > 0 {
		return n
	}
	return 1000
}()

func burstShapes(b *testing.B) []int {
	v := os.Getenv("LUAOP_BENCH_SOURCES")
	if v == "" {
		return []int{10, 1}
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 || burstCopies%n != 0 {
			b.Fatalf("LUAOP_BENCH_SOURCES=%q: want divisors of the copies (1000), comma-separated", v)
		}
		out = append(out, n)
	}
	return out
}

// burst runs f(0..n-1) on 32 concurrent writers (the edits "at once").
func burst(n int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func replicatorBurst(b *testing.B, sources, namespaces int) {
	src := env.Namespace(b)
	targets := make([]string, namespaces)
	for i := range targets {
		targets[i] = env.Namespace(b)
	}
	burst(namespaces, func(i int) {
		patch := `{"metadata":{"labels":{"luaop.dev/replica":"true"}}}`
		if _, err := env.Kube.CoreV1().Namespaces().Patch(b.Context(), targets[i], types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			b.Error(err)
		}
	})
	data := map[string]string{"level": "info", "region": "eu"}
	names := make([]string, sources)
	for i := range names {
		names[i] = fmt.Sprintf("settings-%d", i)
		if _, err := env.Kube.CoreV1().ConfigMaps(src).Create(b.Context(), &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{"luaop.dev/replicate": "true"}}, Data: data,
		}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}

	// The copies are watched from here (the test's own client, a watch that resumes
	// where it broke: a long one under load gets closed by the server): every state
	// in which a copy is as its source, with its resourceVersion and when it was
	// seen. A copy is healed at the first such state newer than its edit (the
	// resourceVersions of one object grow: etcd's revisions, compared here as
	// numbers, as a benchmark may).
	type copyKey struct{ ns, name string }
	type seenGood struct {
		rv uint64
		at time.Time
	}
	var (
		mu       sync.Mutex
		healthy  = map[copyKey]bool{}
		goodSeen = map[copyKey][]seenGood{}
		edited   = map[copyKey]seenGood{} // the edit's answer: its resourceVersion, when
	)
	list, err := env.Kube.CoreV1().ConfigMaps("").List(b.Context(), metav1.ListOptions{LabelSelector: "luaop.dev/replica-of"})
	if err != nil {
		b.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(b.Context(), list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = "luaop.dev/replica-of"
			return env.Kube.CoreV1().ConfigMaps("").Watch(ctx, o)
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			if !ok || !strings.HasPrefix(cm.Labels["luaop.dev/replica-of"], src+".") {
				continue
			}
			k := copyKey{cm.Namespace, cm.Name}
			good := ev.Type != watch.Deleted && maps.Equal(cm.Data, data)
			rv, _ := strconv.ParseUint(cm.ResourceVersion, 10, 64)
			now := time.Now()
			mu.Lock()
			healthy[k] = good
			if good {
				goodSeen[k] = append(goodSeen[k], seenGood{rv, now})
			}
			mu.Unlock()
		}
	}()
	// healedAt: when each edited copy was first seen healed (a lock held).
	healedAt := func() map[copyKey]time.Time {
		out := map[copyKey]time.Time{}
		for k, e := range edited {
			for _, g := range goodSeen[k] {
				if g.rv > e.rv {
					out[k] = g.at
					break
				}
			}
		}
		return out
	}

	counter := func() *requestCounter {
		_, c := startCountedWithin(b, "replicator.lua", 10*time.Minute)
		return c
	}()
	total := sources * namespaces
	countHealthy := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, ok := range healthy {
			if ok {
				n++
			}
		}
		return n
	}
	testcluster.Eventually(b, 10*time.Minute, func() (bool, string) {
		n := countHealthy()
		return n == total, fmt.Sprintf("%d of %d copies made", n, total)
	})

	before, _ := counter.snapshot()
	start := time.Now()
	burst(total, func(i int) {
		k := copyKey{targets[i%namespaces], names[i/namespaces]}
		patch := `{"data":{"level":"tampered","extra":"x"}}`
		cm, err := env.Kube.CoreV1().ConfigMaps(k.ns).Patch(b.Context(), k.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			b.Error(err)
			return
		}
		now := time.Now()
		rv, _ := strconv.ParseUint(cm.ResourceVersion, 10, 64)
		mu.Lock()
		edited[k] = seenGood{rv, now}
		mu.Unlock()
	})
	editing := time.Since(start)
	testcluster.Eventually(b, 10*time.Minute, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := len(healedAt())
		return n == total, fmt.Sprintf("%d of %d edited copies healed (%d edits answered)", n, total, len(edited))
	})
	all := time.Since(start)
	after, lists := counter.snapshot()
	b.StopTimer()

	mu.Lock()
	times := make([]time.Duration, 0, total)
	var lines []string
	for k, at := range healedAt() {
		d := max(at.Sub(edited[k].at), 0) // the watch may show the heal before the edit's answer arrives
		times = append(times, d)
		lines = append(lines, fmt.Sprintf("%s/%s\t%d", k.ns, k.name, d.Milliseconds()))
	}
	mu.Unlock()
	slices.Sort(times)
	pct := func(p float64) time.Duration { return times[min(len(times)-1, int(p*float64(len(times))))] }
	b.Logf("%d copies (%d sources x %d namespaces) edited at once in %s; all healed %s after the first edit",
		total, sources, namespaces, editing.Round(time.Millisecond), all.Round(time.Millisecond))
	b.Logf("healing time per copy (edit answered -> healed copy seen): p50 %s  p90 %s  p99 %s  max %s",
		pct(0.5).Round(time.Millisecond), pct(0.9).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
	delta := map[string]int{}
	for verb, n := range after {
		if d := n - before[verb]; d != 0 {
			delta[verb] = d
		}
	}
	b.Logf("operator's requests during the burst: %v", delta)
	if delta["LIST"] != 0 {
		b.Errorf("the operator listed %d time(s) during the burst: %v", delta["LIST"], lists)
	}
	b.ReportMetric(float64(pct(0.5).Milliseconds()), "p50-ms")
	b.ReportMetric(float64(pct(0.99).Milliseconds()), "p99-ms")
	b.ReportMetric(float64(times[len(times)-1].Milliseconds()), "max-ms")
	b.ReportMetric(float64(delta["PATCH"]), "patches")
	if file := os.Getenv("LUAOP_BENCH_HEAL_TIMES"); file != "" {
		slices.Sort(lines)
		body := "copy\thealed-ms\n" + strings.Join(lines, "\n") + "\n"
		if err := os.WriteFile(fmt.Sprintf("%s.sources-%d", file, sources), []byte(body), 0o644); err != nil {
			b.Error(err)
		}
	}
}
