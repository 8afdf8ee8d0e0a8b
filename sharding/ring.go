package sharding

import (
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
)

// DefaultVirtualNodes is how many points each member has on the ring. With a
// few hundred points per member the members' shares of the ring stay within a
// few percent of equal (TestRingBalance measures it); a lookup is a binary
// search, and the ring of 3 members is 3 × 256 points (a few kilobytes).
const DefaultVirtualNodes = 256

// Ring assigns keys to members by consistent hashing with virtual nodes: every
// member is hashed onto a circle at VirtualNodes points, and a key belongs to the
// member of the first point at or after the key's hash. A member joining or
// leaving moves only the keys of the arcs it takes or leaves (about 1/N of them),
// never keys between two members that stay. A Ring is immutable: safe to share.
type Ring struct {
	points []uint64
	// owners[i], the index in members of the member owning points[i]: a plan
	// works on indexes, not strings (its items are 40 bytes).
	owners  []int32
	members []string // sorted, distinct
}

// NewRing builds the ring of members (duplicates and "" ignored) with vnodes
// points each (DefaultVirtualNodes when vnodes <= 0).
func NewRing(members []string, vnodes int) *Ring {
	if vnodes <= 0 {
		vnodes = DefaultVirtualNodes
	}
	ms := slices.Clone(members)
	ms = slices.DeleteFunc(ms, func(s string) bool { return s == "" })
	slices.Sort(ms)
	ms = slices.Compact(ms)
	type point struct {
		at    uint64
		owner int32
	}
	pts := make([]point, 0, len(ms)*vnodes)
	for j, m := range ms {
		for i := range vnodes {
			pts = append(pts, point{hashKey(m + "#" + strconv.Itoa(i)), int32(j)})
		}
	}
	// Ties (two members on one point, astronomically rare) are broken by name
	// (members are sorted: by index), so every replica builds the same ring from
	// the same members.
	sort.Slice(pts, func(i, j int) bool {
		if pts[i].at != pts[j].at {
			return pts[i].at < pts[j].at
		}
		return pts[i].owner < pts[j].owner
	})
	r := &Ring{points: make([]uint64, len(pts)), owners: make([]int32, len(pts)), members: ms}
	for i, p := range pts {
		r.points[i], r.owners[i] = p.at, p.owner
	}
	return r
}

// Members are the ring's members, sorted.
func (r *Ring) Members() []string { return slices.Clone(r.members) }

// Len is the number of members.
func (r *Ring) Len() int { return len(r.members) }

// Has tells whether member is on the ring.
func (r *Ring) Has(member string) bool {
	_, found := slices.BinarySearch(r.members, member)
	return found
}

// Owner is the member key belongs to; "" on an empty ring.
func (r *Ring) Owner(key string) string {
	if len(r.points) == 0 {
		return ""
	}
	return r.members[r.ownerOfHash(hashKey(key))]
}

// hashKey is FNV-1a, then a 64-bit finalizer (splitmix64's), which spreads the
// nearly equal inputs of one member's points ("m#1", "m#2") over the circle.
func hashKey(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return finalize(h.Sum64())
}

// finalize is splitmix64's finalizer.
func finalize(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// ObjectKey is the key an object is hashed by: its resource (group and plural:
// the version does not move an object), namespace and name.
func ObjectKey(group, resource, namespace, name string) string {
	return group + "/" + resource + "/" + namespace + "/" + name
}
