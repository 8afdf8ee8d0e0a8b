package sharding

import (
	"cmp"
	"math"
	"slices"
	"sort"
	"strings"
)

// DefaultTolerance bounds how far a member's share may be from the fair one
// (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam,
// 2016). Virtual nodes alone leave the shares of a few members uneven by 10 to 20 %
// (the ring's arcs are random: TestRingAloneIsUneven). Plan caps every member at
// (1 + Tolerance/(N-1)) × the fair share of N members, so that, the others being
// at most at the cap, none holds less than (1 - Tolerance) × it either: with three
// members and 0.08, between 92 % and 104 % of a third.
const DefaultTolerance = 0.08

// Placement is one object as the coordinator sees it: its key and the member it
// is assigned to now ("" for none; for an object being handed over, the member it
// goes to).
type Placement struct {
	Key     string
	Current string
}

// Plan assigns every object to a member of ring: consistent hashing with bounded
// loads, sticky. Each member may hold at most ceil((1 + tolerance/(N-1)) × n/N)
// objects (N members, n objects; tolerance <= 0 means DefaultTolerance). An object stays with its current member while that member is on the
// ring and under the bound, objects already at their first choice on the ring
// kept first; every other object goes to the first member clockwise from its hash
// with room. So a member joining takes from each of the others only what they hold
// above the bound, mostly the objects that hash to it; a member leaving gives its
// objects, and only those, to the others; a new object moves no other. The result
// depends only on the placements and the members, so every coordinator computes
// the same. Returns key -> member (nil on an empty ring).
func Plan(ring *Ring, objects []Placement, tolerance float64) map[string]string {
	if ring.Len() == 0 {
		return nil
	}
	items := make([]planItem, len(objects))
	for i, p := range objects {
		items[i] = planItem{hash: hashKey(p.Key), tie: p.Key, current: ring.indexOf(p.Current)}
	}
	assign(ring, items, tolerance)
	plan := make(map[string]string, len(items))
	for _, it := range items {
		plan[it.tie] = ring.members[it.member]
	}
	return plan
}

// planItem is one object to place: its hash (hashKey of its ObjectKey), what
// breaks a tie of two hashes (its key), its current member; assign sets member.
// Members are indexes in the ring's members (-1: none, or not on the ring), so
// an item is 40 bytes: the coordinator keeps one per object between passes. at
// is the caller's (the coordinator's: the object's store).
type planItem struct {
	hash                   uint64
	tie                    string
	current, first, member int32
	at                     int32
}

// assign is Plan on items, in place: it sets each item's member and reorders
// items (by hash). It allocates nothing but the load of each member, so the
// coordinator's passes reuse one slice of items.
func assign(ring *Ring, items []planItem, tolerance float64) {
	if ring.Len() == 0 {
		for i := range items {
			items[i].member = -1
		}
		return
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	n, members := len(items), ring.Len()
	factor := 1.0
	if members > 1 {
		factor += tolerance / float64(members-1)
	}
	limit := max(int(math.Ceil(factor*float64(n)/float64(members))), 1)
	for i := range items {
		items[i].first, items[i].member = ring.ownerOfHash(items[i].hash), -1
	}
	// One fixed order (by hash, then key) so that who stays when a member is full
	// does not depend on the order the objects were listed in.
	slices.SortFunc(items, func(a, b planItem) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return strings.Compare(a.tie, b.tie)
	})
	load := make([]int, members)
	keep := func(preferred bool) {
		for i := range items {
			it := &items[i]
			// current < 0: no member, or one not on the ring.
			if it.member >= 0 || it.current < 0 || (it.current == it.first) != preferred {
				continue
			}
			if load[it.current] < limit {
				it.member = it.current
				load[it.member]++
			}
		}
	}
	keep(true)
	keep(false)
	for i := range items {
		it := &items[i]
		if it.member >= 0 {
			continue
		}
		it.member = ring.walk(it.hash, func(m int32) bool { return load[m] < limit })
		load[it.member]++
	}
}

// indexOf is member's index in the ring's members; -1 when not on the ring (or
// "").
func (r *Ring) indexOf(member string) int32 {
	if i, found := slices.BinarySearch(r.members, member); found {
		return int32(i)
	}
	return -1
}

// hashParts is hashKey(ObjectKey(group, resource, namespace, name)) without
// building the key.
func hashParts(group, resource, namespace, name string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	x := uint64(offset)
	for i, part := range [...]string{group, resource, namespace, name} {
		if i > 0 {
			x = (x ^ '/') * prime
		}
		for j := 0; j < len(part); j++ {
			x = (x ^ uint64(part[j])) * prime
		}
	}
	return finalize(x)
}

// ownerOfHash is Owner for a key already hashed, as an index in members (-1
// on an empty ring).
func (r *Ring) ownerOfHash(h uint64) int32 {
	if len(r.points) == 0 {
		return -1
	}
	return r.owners[r.index(h)]
}

func (r *Ring) index(h uint64) int {
	i := sort.Search(len(r.points), func(i int) bool { return r.points[i] >= h })
	if i == len(r.points) {
		return 0
	}
	return i
}

// walk returns the first member clockwise from h that ok accepts; the first
// member from h when none does (cannot happen with a bound above the fair share).
func (r *Ring) walk(h uint64, ok func(int32) bool) int32 {
	start := r.index(h)
	for j := range len(r.points) {
		if m := r.owners[(start+j)%len(r.points)]; ok(m) {
			return m
		}
	}
	return r.owners[start]
}
