package transport

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// ringPoint is a partition's place on the hash ring, as a fraction of the
// circle clockwise from the top, and its owner's index in the owner table's
// members.
type ringPoint struct {
	at    float64
	owner uint32
}

// partitionPoint is where consistent hashing puts partition p on the
// circle: at XXH64 of p's eight little-endian bytes (buraksezer/consistent
// places partitions so, and ring's hasher is XXH64), as a fraction of 2^64.
func partitionPoint(p uint64) float64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], p)
	return float64(xxhash.Sum64(b[:])) / (1 << 64)
}

// ringSpan is one arc of the ring drawing: from and to are fractions of
// the circle clockwise from the top, from < to ≤ from + 1 (a span may run
// past the top, to > 1), and owner is an index in the owner table's
// members.
type ringSpan struct {
	from, to float64
	owner    uint32
}

// ringSpans lays an owner table out as the ring it is: each partition from
// its own point on the circle (partitionPoint) to the next partition's
// point clockwise, neighbours with one owner merged into one span. So each
// member shows as the many arcs it holds, interleaved with the others' as
// consistent hashing lays them out. A span's length is the stretch of the
// circle between its partitions' points, not a share of keys: a key's
// partition is its hash modulo the partition count, so every partition
// holds an equal share of keys. It returns nil for a table without owners
// or whose owners do not index its members. The spans are at most the
// partitions.
func ringSpans(ot *sluicev1.OwnersResponse) []ringSpan {
	owners, members := ot.GetOwners(), ot.GetMembers()
	if len(owners) == 0 || int64(len(owners)) != ot.GetPartitions() {
		return nil
	}
	pts := make([]ringPoint, len(owners))
	for p, o := range owners {
		if int(o) >= len(members) {
			return nil
		}
		pts[p] = ringPoint{at: partitionPoint(uint64(p)), owner: o}
	}
	slices.SortFunc(pts, func(a, b ringPoint) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return int(a.owner) - int(b.owner)
	})
	// The run that wraps past the top starts after the last point whose
	// owner differs from the first point's: start there, so that it is one
	// span.
	n, start := len(pts), 0
	for i := n - 1; i > 0; i-- {
		if pts[i].owner != pts[0].owner {
			start = (i + 1) % n
			break
		}
	}
	// at is point k of the walk from start, unwrapped past the top.
	at := func(k int) float64 {
		if start+k >= n {
			return pts[(start+k)%n].at + 1
		}
		return pts[start+k].at
	}
	var spans []ringSpan
	for i := 0; i < n; {
		o := pts[(start+i)%n].owner
		j := i + 1
		for j < n && pts[(start+j)%n].owner == o {
			j++
		}
		spans = append(spans, ringSpan{from: at(i), to: at(j), owner: o})
		i = j
	}
	return spans
}

// ringArcs is the page's drawing of ringSpans(ot): colors maps a member's
// name to its colour and share (members not in it are grey). Nil when
// ringSpans is.
func ringArcs(ot *sluicev1.OwnersResponse, colors map[string]pageArc) []pageArc {
	spans := ringSpans(ot)
	if spans == nil {
		return nil
	}
	arcs := make([]pageArc, len(spans))
	for i, sp := range spans {
		name := ot.GetMembers()[sp.owner].GetName()
		a, ok := colors[name]
		if !ok {
			a.Color = "#bab0ac"
		}
		arcs[i] = pageArc{Member: name, Color: a.Color, Share: a.Share, D: arcPath(sp.from, sp.to)}
	}
	return arcs
}
