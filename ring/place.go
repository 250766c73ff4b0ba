package ring

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// This file places partitions the way consistent.New does, but from the
// previous placement instead of from nothing, so that a membership event
// costs work in proportion to what changed rather than to the cluster.
//
// consistent builds a hash circle of VirtualNodes points per member
// (xxhash of the member's name followed by the point's number in decimal),
// sorts it, and then gives the partitions out in order 0, 1, 2, …: each to
// the first point at or after the partition's hash (xxhash of the
// partition number, 8 bytes little-endian) whose member still holds fewer
// than ceil(floor(Partitions/members) × Load) partitions. Rebuilding that
// from nothing costs members × VirtualNodes hashes, a sort of the circle,
// and a binary search per partition: 13 ms for 100 members, 95 ms for
// 1,000 (BenchmarkBuildTable).
//
// A placer keeps the circle of the last member set it placed. The next set
// differs from it by a few members: their points are removed or merged in
// (one linear pass), the partitions' starting points are found by walking
// the circle and the partitions sorted by hash side by side (another), and
// the bounded-load walk runs over plain arrays. The result is the same
// table consistent computes for the same members, whatever sets the placer
// saw before (TestPlacerAgreesWithConsistent): the circle is a function of
// the member set, and keeping it only saves recomputing it.

// circle is the hash circle of one member set: every member's points,
// sorted by hash. Members have ids for as long as they stay in the
// circles the placer makes one from another, so that a join or a leave
// copies the points of everyone else as they are.
type circle struct {
	names  []string // names[id]: the member with that id; "" a free id
	sorted []int32  // the members' ids, by name
	hashes []uint64 // the points, sorted
	ids    []int32  // ids[i]: the member whose point i is
	// owner[i]: the member point i leads to, which is ids[i] except where
	// points share a hash (pointOwner).
	owner []int32
}

// partOrder is what the placement needs of the partitions alone, the same
// for every member set: each partition's hash and the partitions sorted
// by it.
type partOrder struct {
	hash   []uint64 // hash[p]: xxhash of p as 8 bytes little-endian
	byHash []int32  // partitions sorted by hash (then number)
}

func newPartOrder(partitions int) *partOrder {
	po := &partOrder{hash: make([]uint64, partitions), byHash: make([]int32, partitions)}
	var b [8]byte
	for p := range po.hash {
		binary.LittleEndian.PutUint64(b[:], uint64(p))
		po.hash[p] = xxhash.Sum64(b[:])
		po.byHash[p] = int32(p)
	}
	slices.SortFunc(po.byHash, func(a, b int32) int {
		if c := cmp.Compare(po.hash[a], po.hash[b]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	return po
}

// placer places partitions for member sets one after another, keeping the
// circle of the last one. It is not safe for concurrent use: Ring
// serialises its calls.
type placer struct {
	cfg   Config
	parts *partOrder // made on first use
	last  circle
	// spare holds the arrays of the circle before last, reused for the
	// next one; nothing returned refers to them.
	spare circle
	// Scratch reused between calls.
	start   []int32 // start[p]: the first point at or after partition p's hash
	loads   []int32
	edits   []edit
	pts     []point
	touched []int
}

type point struct {
	hash uint64
	id   int32
}

// edit is one change to the last circle's points: drop the point at index
// at, or insert p before it.
type edit struct {
	at   int
	drop bool
	p    point
}

// place returns the table of members, sorted by name and checked
// (sortedMembers), and keeps their circle for the next call.
func (pl *placer) place(members []Member) (*Table, error) {
	cfg := pl.cfg
	n := len(members)
	if n == 0 {
		pl.spare, pl.last = pl.last, circle{}
		return emptyTable(cfg), nil
	}
	if err := checkRoom(cfg, n); err != nil {
		return nil, err
	}
	if pl.parts == nil {
		pl.parts = newPartOrder(cfg.Partitions)
	}
	next := pl.nextCircle(members)
	owners, err := pl.walk(next)
	if err != nil {
		return nil, err
	}
	// Owners by member id → by index in members (sorted by name).
	index := make([]int32, len(next.names))
	for i, id := range next.sorted {
		index[id] = int32(i)
	}
	for p, id := range owners {
		owners[p] = index[id]
	}
	pl.spare, pl.last = pl.last, next
	return newTable(cfg, members, owners), nil
}

// nextCircle returns the circle of members (sorted by name) made from the
// last one: the points of members no longer there dropped, the new
// members' inserted, everyone else's copied as they are.
func (pl *placer) nextCircle(members []Member) circle {
	old := pl.last
	next := circle{
		names:  append(pl.spare.names[:0], old.names...),
		sorted: pl.spare.sorted[:0],
	}
	pl.edits = pl.edits[:0]
	pl.pts = pl.pts[:0]
	freeID := 0 // the next id to look at for a free one
	newID := func(name string) int32 {
		for ; freeID < len(next.names); freeID++ {
			if next.names[freeID] == "" {
				next.names[freeID] = name
				return int32(freeID)
			}
		}
		next.names = append(next.names, name)
		freeID = len(next.names)
		return int32(freeID - 1)
	}
	// Members that left first, so that their ids are free for those that
	// joined.
	var left []int32
	i := 0
	for _, m := range members {
		for i < len(old.sorted) && old.names[old.sorted[i]] < m.Name {
			left = append(left, old.sorted[i])
			i++
		}
		if i < len(old.sorted) && old.names[old.sorted[i]] == m.Name {
			i++
		}
	}
	left = append(left, old.sorted[i:]...)
	for _, id := range left {
		pl.pts = appendPoints(pl.pts[:0], old.names[id], id, pl.cfg.VirtualNodes)
		for _, pt := range pl.pts {
			at, _ := slices.BinarySearch(old.hashes, pt.hash)
			for old.ids[at] != id { // another member's point with the same hash
				at++
			}
			pl.edits = append(pl.edits, edit{at: at, drop: true})
		}
		next.names[id] = ""
	}
	pl.pts = pl.pts[:0]
	i = 0
	for _, m := range members {
		for i < len(old.sorted) && old.names[old.sorted[i]] < m.Name {
			i++ // left: its points are dropped above
		}
		if i < len(old.sorted) && old.names[old.sorted[i]] == m.Name {
			next.sorted = append(next.sorted, old.sorted[i])
			i++
			continue
		}
		id := newID(m.Name)
		next.sorted = append(next.sorted, id)
		pl.pts = appendPoints(pl.pts, m.Name, id, pl.cfg.VirtualNodes)
	}
	for _, pt := range pl.pts {
		at, _ := slices.BinarySearch(old.hashes, pt.hash)
		pl.edits = append(pl.edits, edit{at: at, p: pt})
	}
	// Inserts at one index go in hash order, before a drop there.
	slices.SortFunc(pl.edits, func(a, b edit) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		if a.drop != b.drop {
			if a.drop {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.p.hash, b.p.hash)
	})

	size := len(members) * pl.cfg.VirtualNodes
	next.hashes = slices.Grow(pl.spare.hashes[:0], size)
	next.ids = slices.Grow(pl.spare.ids[:0], size)
	next.owner = slices.Grow(pl.spare.owner[:0], size)
	touched := pl.touched[:0] // places in next next to an edit
	src := 0
	for _, e := range pl.edits {
		next.hashes = append(next.hashes, old.hashes[src:e.at]...)
		next.ids = append(next.ids, old.ids[src:e.at]...)
		next.owner = append(next.owner, old.owner[src:e.at]...)
		src = e.at
		touched = append(touched, len(next.hashes))
		if e.drop {
			src++
			continue
		}
		next.hashes = append(next.hashes, e.p.hash)
		next.ids = append(next.ids, e.p.id)
		next.owner = append(next.owner, e.p.id)
	}
	next.hashes = append(next.hashes, old.hashes[src:]...)
	next.ids = append(next.ids, old.ids[src:]...)
	next.owner = append(next.owner, old.owner[src:]...)
	// Only the points beside an edit can have gained or lost a point
	// with the same hash.
	for _, k := range touched {
		for j := max(k-1, 0); j <= k && j < len(next.hashes); j++ {
			if (j > 0 && next.hashes[j-1] == next.hashes[j]) || (j+1 < len(next.hashes) && next.hashes[j+1] == next.hashes[j]) || next.owner[j] != next.ids[j] {
				next.owner[j] = next.pointOwner(j)
				for i := j - 1; i >= 0 && next.hashes[i] == next.hashes[j]; i-- {
					next.owner[i] = next.owner[j]
				}
				for i := j + 1; i < len(next.hashes) && next.hashes[i] == next.hashes[j]; i++ {
					next.owner[i] = next.owner[j]
				}
			}
		}
	}
	pl.touched = touched
	return next
}

// appendPoints appends member's vnodes points (consistent's keys: the
// name followed by the point's number in decimal), sorted by hash, to dst.
func appendPoints(dst []point, name string, id int32, vnodes int) []point {
	var arr [64]byte
	buf := append(arr[:0], name...)
	from := len(dst)
	for v := range vnodes {
		key := strconv.AppendInt(buf, int64(v), 10)
		dst = append(dst, point{hash: xxhash.Sum64(key), id: id})
	}
	slices.SortFunc(dst[from:], func(a, b point) int { return cmp.Compare(a.hash, b.hash) })
	return dst
}

// walk gives every partition, in order, to the first member at or after
// its hash on circle c that has room under the load bound, as consistent
// does, and returns the owners as member ids.
func (pl *placer) walk(c circle) ([]int32, error) {
	cfg := pl.cfg
	po := pl.parts
	ids := c.owner
	// Each partition's first point: the partitions in hash order walk the
	// circle once.
	pl.start = slices.Grow(pl.start[:0], cfg.Partitions)[:cfg.Partitions]
	k := 0
	for _, p := range po.byHash {
		h := po.hash[p]
		for k < len(c.hashes) && c.hashes[k] < h {
			k++
		}
		if k == len(c.hashes) {
			pl.start[p] = 0
		} else {
			pl.start[p] = int32(k)
		}
	}
	pl.loads = slices.Grow(pl.loads[:0], len(c.names))[:len(c.names)]
	clear(pl.loads)
	bound := int32(math.Ceil(float64(cfg.Partitions/len(c.sorted)) * cfg.Load))
	owners := make([]int32, cfg.Partitions)
	size := len(c.hashes)
	for p := range owners {
		idx := int(pl.start[p])
		for count := 1; ; count++ {
			if count >= size {
				// consistent panics here: the members cannot hold the
				// partitions under the bound.
				return nil, fmt.Errorf("ring: consistent could not place partitions: partition %d found no member with room among %d points", p, size)
			}
			o := ids[idx]
			if pl.loads[o] < bound {
				pl.loads[o]++
				owners[p] = o
				break
			}
			if idx++; idx == size {
				idx = 0
			}
		}
	}
	return owners, nil
}

// pointOwner returns the member of point i. Points that share a hash
// all belong to the member with the greatest name among them: consistent
// keeps every point in its sorted set but maps a hash to the member it
// added last, and it adds them in name order. Names that end in digits
// make such points (node-1's tenth point and node-11's first are both
// "node-110").
func (c *circle) pointOwner(i int) int32 {
	h := c.hashes[i]
	lo, hi := i, i
	for lo > 0 && c.hashes[lo-1] == h {
		lo--
	}
	for hi+1 < len(c.hashes) && c.hashes[hi+1] == h {
		hi++
	}
	o := c.ids[i]
	for j := lo; j <= hi; j++ {
		if c.names[c.ids[j]] > c.names[o] {
			o = c.ids[j]
		}
	}
	return o
}
