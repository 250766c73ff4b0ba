package ring

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// members returns n members with realistic, distinct names drawn from rng
// (rng == nil gives node-0 … node-(n-1), StatefulSet style).
func members(rng *rand.Rand, n int) []Member {
	ms := make([]Member, n)
	seen := make(map[string]bool, n)
	for i := range ms {
		name := fmt.Sprintf("node-%d", i)
		if rng != nil {
			for {
				name = fmt.Sprintf("sluice-%08x", rng.Uint32())
				if !seen[name] {
					break
				}
			}
		}
		seen[name] = true
		ms[i] = Member{Name: name, Addr: fmt.Sprintf("10.0.%d.%d:8081", i/250, i%250+1)}
	}
	return ms
}

func mustTable(tb testing.TB, cfg Config, ms []Member) *Table {
	tb.Helper()
	t, err := BuildTable(cfg, ms)
	if err != nil {
		tb.Fatalf("BuildTable(%d members): %v", len(ms), err)
	}
	return t
}

// balance is max share / mean share.
func balance(t *Table) float64 {
	var most int32
	for _, c := range t.owned {
		most = max(most, c)
	}
	return float64(most) * float64(t.Len()) / float64(t.partitions)
}

// movement compares partition owners of two tables: moved is the fraction of
// partitions whose owner changed; between is the fraction that moved from one
// member present in both tables to another member present in both.
func movement(a, b *Table) (moved, between float64) {
	inA := make(map[string]bool, a.Len())
	for _, m := range a.members {
		inA[m.Name] = true
	}
	inB := make(map[string]bool, b.Len())
	for _, m := range b.members {
		inB[m.Name] = true
	}
	var nMoved, nBetween int
	for p := range a.Partitions() {
		oa, _ := a.PartitionOwner(p)
		ob, _ := b.PartitionOwner(p)
		if oa.Name == ob.Name {
			continue
		}
		nMoved++
		if inA[ob.Name] && inB[oa.Name] {
			nBetween++
		}
	}
	n := float64(a.Partitions())
	return float64(nMoved) / n, float64(nBetween) / n
}

// shuffled returns a shuffled copy of ms.
func shuffled(rng *rand.Rand, ms []Member) []Member {
	c := append([]Member(nil), ms...)
	rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	return c
}
