package processing

import (
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
	testingclock "k8s.io/utils/clock/testing"
)

// The two-lane storage under client-go's work queue (its dirty and processing sets
// decide what reaches the storage): the front lane is served first, each lane in
// FIFO order, and a key is never queued twice. Steps: "add k" (queued as any
// key), "front k" (marked for the front, then added, as queueNewcomer does),
// "get k" (the next key a worker gets must be k), "done k" (the worker is done
// with k). The queue must end empty.
func TestLaneFIFOOrder(t *testing.T) {
	cases := []struct {
		name    string
		sharded bool
		steps   string
	}{
		{"unsharded: plain FIFO", false,
			"add a, add b, front c, add a, get a, get b, get c"},
		{"back lane only: FIFO", true,
			"add a, add b, add c, get a, get b, get c"},
		{"front lane first, FIFO within each lane", true,
			"add a, add b, front x, add c, front y, get x, get y, get a, get b, get c"},
		{"interleaved with gets", true,
			"add a, add b, get a, front x, add c, front y, get x, front z, get y, get z, get b, get c"},
		{"a key queued at the back moved to the front is not duplicated", true,
			"add a, add b, add c, front b, get b, get a, get c"},
		{"moved to the front, then queued at the back again after its cycle", true,
			"add a, add b, add c, front b, get b, add b, done b, get a, get c, get b"},
		{"moved to the front twice", true,
			"add a, add b, front b, get b, done b, add b, front b, add c, get b, get a, get c"},
		{"already in front: a second mark changes nothing", true,
			"add a, front x, front y, front x, get x, get y, get a"},
		{"added again at the back while in front: stays in front", true,
			"add a, front x, add x, get x, get a"},
		{"marked while in a worker's hands: in front once its cycle is done", true,
			"add a, add x, get a, get x, add b, front x, done x, get x, get b"},
		{"added as any key while in a worker's hands: at the back", true,
			"add x, get x, add a, add x, done x, get a, get x"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var marks *frontMarks
			if tc.sharded {
				marks = newFrontMarks()
			}
			q := workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[objectKey]{
				Clock: testingclock.NewFakeClock(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)), Queue: newLaneFIFO(nil, marks)})
			defer q.ShutDown()
			key := func(name string) objectKey { return objectKey{resource: widgets, namespace: "default", name: name} }
			for _, step := range strings.Split(tc.steps, ", ") {
				verb, name, _ := strings.Cut(step, " ")
				switch verb {
				case "add":
					q.Add(key(name))
				case "front":
					if marks != nil {
						marks.mark(key(name))
					}
					q.Add(key(name))
				case "get":
					if q.Len() == 0 {
						t.Fatalf("%s: the queue is empty", step)
					}
					got, _ := q.Get()
					if got.name != name {
						t.Fatalf("%s: got %s", step, got.name)
					}
				case "done":
					q.Done(key(name))
				default:
					t.Fatalf("unknown step %q", step)
				}
			}
			if n := q.Len(); n != 0 {
				t.Fatalf("%d keys left in the queue", n)
			}
		})
	}
}
