package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// sameTable reports how got differs from want (BuildTable's), or "".
func sameTable(got, want *Table) string {
	switch {
	case !slices.Equal(got.members, want.members):
		return fmt.Sprintf("members differ: %d against %d", len(got.members), len(want.members))
	case got.r != want.r || got.partitions != want.partitions:
		return fmt.Sprintf("shape differs: r %d/%d, partitions %d/%d", got.r, want.r, got.partitions, want.partitions)
	case !slices.Equal(got.owned, want.owned):
		return "owned counts differ"
	}
	for p := range want.owner {
		if g, w := got.appendRow(p, nil), want.appendRow(p, nil); !slices.Equal(g, w) {
			return fmt.Sprintf("partition %d: row %v, consistent's %v", p, g, w)
		}
	}
	return ""
}

// A ring that sees member sets one after another, each differing from the
// last by joins and leaves, builds for each exactly the table consistent
// builds for that set from nothing (BuildTable): the placer's kept circle
// changes its cost, never its result.
func TestPlacerAgreesWithConsistent(t *testing.T) {
	t.Parallel()
	configs := []Config{
		DefaultConfig(),
		{Partitions: 271, ReplicationFactor: 3, Load: 1.25, VirtualNodes: 20},
		{Partitions: 31, ReplicationFactor: 2, Load: 1.05, VirtualNodes: 3},
		// Numbered names, whose points share hashes: see
		// TestPlacerNumberedNames.
		{Partitions: 271, ReplicationFactor: 2, Load: 1.25, VirtualNodes: 40},
	}
	for ci, cfg := range configs {
		rng := rand.New(rand.NewPCG(uint64(ci), 7))
		pool := members(rng, 80)
		if ci == 3 {
			pool = members(nil, 80)
		}
		r, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		in := map[string]bool{}
		steps := 60
		if testing.Short() {
			steps = 20
		}
		for step := range steps {
			// One to three members join or leave; sometimes a burst.
			changes := 1 + rng.IntN(3)
			if step%10 == 9 {
				changes = 10
			}
			for range changes {
				m := pool[rng.IntN(len(pool))]
				in[m.Name] = !in[m.Name]
			}
			var ms []Member
			for _, m := range pool {
				if in[m.Name] {
					ms = append(ms, m)
				}
			}
			want, werr := BuildTable(cfg, ms)
			got, gerr := r.Build(shuffled(rng, ms))
			if (werr == nil) != (gerr == nil) {
				t.Fatalf("config %d step %d, %d members: BuildTable error %v, Build error %v", ci, step, len(ms), werr, gerr)
			}
			if werr != nil {
				continue
			}
			if d := sameTable(got, want); d != "" {
				t.Fatalf("config %d step %d, %d members: %s", ci, step, len(ms), d)
			}
		}
	}
}

// Large member sets, where a rebuild from nothing is what the placer
// avoids: 300 members, then one joins, then another leaves.
func TestPlacerAgreesWithConsistentLarge(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds three 300-member tables with consistent")
	}
	cfg := DefaultConfig()
	rng := rand.New(rand.NewPCG(11, 12))
	pool := members(rng, 302)
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, ms := range [][]Member{pool[:300], pool[:301], slices.Delete(slices.Clone(pool[:301]), 17, 18), pool[2:302]} {
		got, err := r.Build(ms)
		if err != nil {
			t.Fatal(err)
		}
		if d := sameTable(got, mustTable(t, cfg, ms)); d != "" {
			t.Fatalf("%d members: %s", len(ms), d)
		}
	}
}

// The small configurations of TestBuildTableSmallConfigs: the placer
// refuses what consistent refuses (it panics there) and builds the same
// table otherwise.
func TestPlacerSmallConfigs(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 2, 3, 7, 13, 31} {
		for n := 1; n <= parts+2; n++ {
			for _, vnodes := range []int{1, 2, 5} {
				for _, load := range []float64{1.001, 1.05, 1.25, 2} {
					cfg := Config{Partitions: parts, ReplicationFactor: 3, Load: load, VirtualNodes: vnodes}
					ms := members(nil, n)
					want, werr := BuildTable(cfg, ms)
					r, err := New(cfg)
					if err != nil {
						t.Fatal(err)
					}
					// From a smaller set first, so the circle is reused.
					_, _ = r.Build(ms[:n/2])
					got, gerr := r.Build(ms)
					if (werr == nil) != (gerr == nil) {
						t.Fatalf("%+v, %d members: BuildTable error %v, Build error %v", cfg, n, werr, gerr)
					}
					if werr == nil {
						if d := sameTable(got, want); d != "" {
							t.Fatalf("%+v, %d members: %s", cfg, n, d)
						}
					}
				}
			}
		}
	}
}

// The points of two members that collide on a hash go to the later name,
// as in consistent's map from hash to member.
func TestPlacerCollidingPoints(t *testing.T) {
	t.Parallel()
	// b's and c's points share a hash; ids are not in name order.
	c := circle{names: []string{"c", "a", "b"}, sorted: []int32{1, 2, 0},
		hashes: []uint64{10, 20, 20, 30}, ids: []int32{1, 0, 2, 2}}
	var got []int32
	for i := range c.hashes {
		got = append(got, c.pointOwner(i))
	}
	if !slices.Equal(got, []int32{1, 0, 0, 2}) {
		t.Fatalf("owners %v, want [1 0 0 2]", got)
	}
}

// Numbered names (a StatefulSet's pods) make points that share a hash:
// node-1's point 10 and node-11's point 0 are both "node-110". The
// placer agrees with consistent on them, as members come and go.
func TestPlacerNumberedNames(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	all := members(nil, 130)
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sets := [][]Member{all[:120], all[:121], append(slices.Clone(all[:11]), all[12:125]...), all[1:130]}
	if testing.Short() {
		sets = sets[:2]
	}
	for _, ms := range sets {
		got, err := r.Build(ms)
		if err != nil {
			t.Fatal(err)
		}
		if d := sameTable(got, mustTable(t, cfg, ms)); d != "" {
			t.Fatalf("%d members: %s", len(ms), d)
		}
	}
}

func BenchmarkBuildTable(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			ms := members(nil, n)
			for b.Loop() {
				if _, err := BuildTable(DefaultConfig(), ms); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMembershipEvent is the ring's share of one membership event on
// a node: one member joins or leaves a ring of n, alternately, and the new
// table is built from the last.
func BenchmarkMembershipEvent(b *testing.B) {
	large := DefaultConfig()
	large.Partitions, large.Load = 65521, 1.25 // docs/ring.md's settings past 500 members
	for _, tc := range []struct {
		n   int
		cfg Config
	}{{10, DefaultConfig()}, {100, DefaultConfig()}, {1000, DefaultConfig()}, {1000, large}} {
		n := tc.n
		name := fmt.Sprintf("members=%d", n)
		if tc.cfg.Partitions != DefaultConfig().Partitions {
			name += fmt.Sprintf("/partitions=%d", tc.cfg.Partitions)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			r, err := New(tc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			ms := members(nil, n+1)
			slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
			sets := [2][]Member{ms[:n], ms}
			if _, err := r.Build(sets[0]); err != nil {
				b.Fatal(err)
			}
			i := 1
			for b.Loop() {
				if _, err := r.Build(sets[i&1]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}

func TestHas(t *testing.T) {
	t.Parallel()
	ms := members(nil, 12)
	tab := mustTable(t, DefaultConfig(), ms)
	for _, m := range ms {
		if !tab.Has(m.Name) {
			t.Errorf("Has(%q) = false", m.Name)
		}
	}
	for _, name := range []string{"", "node-", "node-12", "node-1x", "zzz"} {
		if tab.Has(name) {
			t.Errorf("Has(%q) = true", name)
		}
	}
	if emptyTable(DefaultConfig()).Has("node-0") {
		t.Error("the empty table has a member")
	}
}

// Index, PartitionOwnerIndex and InRow say what Members, PartitionOwner
// and PartitionReplicas say, by member number, for every partition and
// member of tables of 1 to 12 members and replication factors 1 to 4.
func TestIndexAndInRowAgreeWithRows(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 5, 12} {
		for r := 1; r <= 4; r++ {
			cfg := DefaultConfig()
			cfg.Partitions, cfg.ReplicationFactor = 271, r
			tab := mustTable(t, cfg, members(nil, n))
			ms := tab.Members()
			for i, m := range ms {
				if got := tab.Index(m.Name); got != i {
					t.Fatalf("n=%d: Index(%q) = %d, want %d", n, m.Name, got, i)
				}
			}
			if tab.Index("zzz") != -1 || tab.Index("") != -1 {
				t.Fatal("Index of a name not in the table is not -1")
			}
			var row []Member
			for p := range cfg.Partitions {
				o, _ := tab.PartitionOwner(p)
				if got := tab.PartitionOwnerIndex(p); ms[got] != o {
					t.Fatalf("n=%d r=%d p=%d: PartitionOwnerIndex %d (%s), owner %s", n, r, p, got, ms[got].Name, o.Name)
				}
				row = tab.PartitionReplicas(p, row[:0])
				for i, m := range ms {
					if want := slices.Contains(row, m); tab.InRow(p, i) != want {
						t.Fatalf("n=%d r=%d p=%d: InRow(%s) = %v, row %v", n, r, p, m.Name, !want, row)
					}
				}
			}
			if tab.InRow(0, -1) || tab.InRow(0, n) || tab.InRow(-1, 0) || tab.InRow(cfg.Partitions, 0) {
				t.Fatal("InRow out of range is true")
			}
		}
	}
	empty := emptyTable(DefaultConfig())
	if empty.PartitionOwnerIndex(0) != -1 || empty.InRow(0, 0) || empty.Index("node-0") != -1 {
		t.Error("the empty table has an owner or a row")
	}
}
