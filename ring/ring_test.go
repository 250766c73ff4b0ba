package ring

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

func newRing(t *testing.T, cfg Config, ms []Member) *Ring {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetMembers(ms); err != nil {
		t.Fatal(err)
	}
	return r
}

// newConsistent builds the library's own ring for the same members, for
// comparison.
func newConsistent(cfg Config, ms []Member) *consistent.Consistent {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	cms := make([]consistent.Member, len(ms))
	for i, m := range ms {
		cms[i] = cmember(m.Name)
	}
	return consistent.New(cms, consistentConfig(cfg))
}

func randomKey(rng *rand.Rand) (name, key string) {
	return fmt.Sprintf("rule.%d", rng.IntN(50)), fmt.Sprintf("user:%d", rng.Uint64())
}

func TestDeterminism(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	ms := members(rng, 9)
	cfg := DefaultConfig()
	cfg.ReplicationFactor = 3
	rings := make([]*Ring, 5)
	for i := range rings {
		rings[i] = newRing(t, cfg, shuffled(rng, ms))
	}
	for i, r := range rings[1:] {
		if d := sameTable(r.Table(), rings[0].Table()); d != "" {
			t.Fatalf("ring %d: table differs from ring 0: %s", i+1, d)
		}
	}
	var want, got []Member
	for range 100_000 {
		h := Hash(randomKey(rng))
		o0, _ := rings[0].Owner(h)
		want = rings[0].Replicas(h, want[:0])
		for i, r := range rings[1:] {
			if o, _ := r.Owner(h); o != o0 {
				t.Fatalf("hash %x: ring %d owner %v, ring 0 owner %v", h, i+1, o, o0)
			}
			if got = r.Replicas(h, got[:0]); !slices.Equal(got, want) {
				t.Fatalf("hash %x: ring %d replicas %v, ring 0 %v", h, i+1, got, want)
			}
		}
	}
}

// The partition and owner agree with what consistent computes for the key
// bytes name+"\x00"+key.
func TestAgreesWithConsistent(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 3, 8, 16} {
		ms := members(rng, n)
		cfg := DefaultConfig()
		r := newRing(t, cfg, shuffled(rng, ms))
		c := newConsistent(cfg, ms)
		tab := r.Table()
		for range 20_000 {
			name, key := randomKey(rng)
			b := []byte(name + "\x00" + key)
			h := Hash(name, key)
			if p, want := tab.Partition(h), c.FindPartitionID(b); p != want {
				t.Fatalf("%q/%q: partition %d, consistent %d", name, key, p, want)
			}
			o, ok := r.Owner(h)
			if want := c.LocateKey(b).String(); !ok || o.Name != want {
				t.Fatalf("%q/%q: owner %q, consistent %q", name, key, o.Name, want)
			}
		}
	}
}

func TestHashMatchesSum64(t *testing.T) {
	t.Parallel()
	if got, want := Hash("api", "user:42"), (hasher{}).Sum64([]byte("api\x00user:42")); got != want {
		t.Fatalf("Hash = %x, xxhash of joined bytes = %x", got, want)
	}
	if Hash("a", "bc") == Hash("ab", "c") {
		t.Fatal("separator does not separate name from key")
	}
}

func TestBalance(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	for n := 3; n <= 16; n++ {
		for s := range 6 {
			var rng *rand.Rand
			if s > 0 {
				rng = rand.New(rand.NewPCG(uint64(n), uint64(s)))
			}
			tab := mustTable(t, cfg, members(rng, n))
			if b := balance(tab); b > 1.10 {
				t.Errorf("%d members, name set %d: max/mean share %.3f > 1.10", n, s, b)
			}
			var sum float64
			for _, v := range tab.Shares() {
				sum += v
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Errorf("%d members: shares sum to %v", n, sum)
			}
		}
	}
}

// Tolerances come from docs/ring.md (defaults, 3..16 members, 201 name sets
// each, 2814 adds and 2814 removes): moved / ideal mean 1.12, worst 1.43 on
// add (ideal 1/(N+1)); mean 1.10, worst 1.46 on remove (ideal 1/N); moves
// between two members present before and after ≤ 3.8 % of partitions on add,
// ≤ 4.4 % on remove.
const (
	maxMovedRatio  = 1.5  // moved fraction / ideal fraction, any one change
	meanMovedRatio = 1.2  // the same, averaged over all changes in the test
	maxBetween     = 0.05 // fraction of partitions moving between two old members
)

func TestMovement(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	rng := rand.New(rand.NewPCG(5, 6))
	hashes := make([]uint64, 20_000)
	for i := range hashes {
		hashes[i] = Hash(randomKey(rng))
	}
	var addSum, remSum float64
	var runs int
	for n := 3; n <= 16; n++ {
		for s := range 6 {
			var rng *rand.Rand
			if s > 0 {
				rng = rand.New(rand.NewPCG(uint64(n), uint64(s)+100))
			}
			all := members(rng, n+1)
			old := mustTable(t, cfg, all[:n])

			// Add one member.
			grown := mustTable(t, cfg, all)
			moved, between := movement(old, grown)
			ideal := 1 / float64(n+1)
			addSum += moved / ideal
			if moved/ideal > maxMovedRatio || between > maxBetween {
				t.Errorf("add to %d (set %d): %.3f of partitions moved (ideal %.3f, ratio %.2f), %.3f between old members",
					n, s, moved, ideal, moved/ideal, between)
			}
			if keys := keysMoved(old, grown, hashes); keys > maxMovedRatio*ideal+0.01 {
				t.Errorf("add to %d (set %d): %.3f of keys moved, ideal %.3f", n, s, keys, ideal)
			}

			// Remove one member.
			less := slices.Delete(slices.Clone(all[:n]), s%n, s%n+1)
			shrunk := mustTable(t, cfg, less)
			moved, between = movement(old, shrunk)
			ideal = 1 / float64(n)
			remSum += moved / ideal
			if moved/ideal > maxMovedRatio || between > maxBetween {
				t.Errorf("remove from %d (set %d): %.3f of partitions moved (ideal %.3f, ratio %.2f), %.3f between survivors",
					n, s, moved, ideal, moved/ideal, between)
			}
			if keys := keysMoved(old, shrunk, hashes); keys > maxMovedRatio*ideal+0.01 {
				t.Errorf("remove from %d (set %d): %.3f of keys moved, ideal %.3f", n, s, keys, ideal)
			}
			runs++
		}
	}
	addMean, remMean := addSum/float64(runs), remSum/float64(runs)
	t.Logf("moved / ideal, mean over %d changes: add %.2f, remove %.2f", runs, addMean, remMean)
	if addMean > meanMovedRatio || remMean > meanMovedRatio {
		t.Errorf("mean moved / ideal: add %.2f, remove %.2f, want ≤ %.2f", addMean, remMean, meanMovedRatio)
	}
}

func keysMoved(a, b *Table, hashes []uint64) float64 {
	var n int
	for _, h := range hashes {
		oa, _ := a.Owner(h)
		ob, _ := b.Owner(h)
		if oa.Name != ob.Name {
			n++
		}
	}
	return float64(n) / float64(len(hashes))
}

func TestReplicas(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 8))
	for n := 1; n <= 7; n++ {
		ms := members(rng, n)
		for rf := 1; rf <= 4; rf++ {
			cfg := DefaultConfig()
			cfg.ReplicationFactor = rf
			cfg.Partitions = 1021 // GetClosestNForPartition is slow; fewer partitions suffice
			tab := mustTable(t, cfg, shuffled(rng, ms))
			c := newConsistent(cfg, ms)
			want := min(rf, n)
			var got []Member
			for p := range tab.Partitions() {
				got = tab.PartitionReplicas(p, got[:0])
				if len(got) != want {
					t.Fatalf("n=%d R=%d partition %d: %d replicas, want %d", n, rf, p, len(got), want)
				}
				if o, _ := tab.PartitionOwner(p); got[0] != o {
					t.Fatalf("n=%d R=%d partition %d: first replica %v, owner %v", n, rf, p, got[0], o)
				}
				seen := map[string]bool{}
				for _, m := range got {
					if seen[m.Name] {
						t.Fatalf("n=%d R=%d partition %d: %v repeats %q", n, rf, p, got, m.Name)
					}
					seen[m.Name] = true
					if i := slices.IndexFunc(ms, func(x Member) bool { return x.Name == m.Name }); i < 0 || ms[i] != m {
						t.Fatalf("replica %v is not one of the members", m)
					}
				}
				lib, err := c.GetClosestNForPartition(p, want)
				if err != nil {
					t.Fatal(err)
				}
				for i := range lib {
					if lib[i].String() != got[i].Name {
						t.Fatalf("n=%d R=%d partition %d: replicas %v, consistent %v", n, rf, p, got, lib)
					}
				}
			}
			// Replicas by hash appends to what dst already holds.
			h := Hash("x", "y")
			pre := []Member{{Name: "keep"}}
			if got := tab.Replicas(h, pre); len(got) != 1+want || got[0].Name != "keep" {
				t.Fatalf("Replicas did not append: %v", got)
			}
		}
	}
}

func TestEmptyRing(t *testing.T) {
	t.Parallel()
	r, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	tab := r.Table()
	if tab == nil || tab.Len() != 0 || len(tab.Members()) != 0 || len(tab.Shares()) != 0 {
		t.Fatalf("empty ring: table %+v", tab)
	}
	h := Hash("a", "b")
	if m, ok := r.Owner(h); ok || m != (Member{}) {
		t.Fatalf("Owner on empty ring = %v, %v", m, ok)
	}
	if got := r.Replicas(h, nil); len(got) != 0 {
		t.Fatalf("Replicas on empty ring = %v", got)
	}
	if p := tab.Partition(h); p < 0 || p >= tab.Partitions() {
		t.Fatalf("Partition = %d", p)
	}
	if _, ok := tab.PartitionOwner(0); ok {
		t.Fatal("PartitionOwner on empty table")
	}
	// Back to empty after having members.
	if err := r.SetMembers(members(nil, 3)); err != nil {
		t.Fatal(err)
	}
	if err := r.SetMembers(nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Owner(h); ok {
		t.Fatal("owner after removing every member")
	}
}

func TestOneMember(t *testing.T) {
	t.Parallel()
	only := Member{Name: "solo", Addr: "127.0.0.1:8081"}
	r := newRing(t, DefaultConfig(), []Member{only})
	rng := rand.New(rand.NewPCG(9, 10))
	for range 1000 {
		h := Hash(randomKey(rng))
		if m, ok := r.Owner(h); !ok || m != only {
			t.Fatalf("Owner = %v, %v", m, ok)
		}
		if got := r.Replicas(h, nil); !slices.Equal(got, []Member{only}) {
			t.Fatalf("Replicas = %v", got)
		}
	}
	if s := r.Table().Shares(); s["solo"] != 1 {
		t.Fatalf("Shares = %v", s)
	}
}

func TestSetMembersErrors(t *testing.T) {
	t.Parallel()
	r := newRing(t, DefaultConfig(), members(nil, 3))
	before := r.Table()
	dup := []Member{{Name: "a", Addr: "1:1"}, {Name: "b", Addr: "2:2"}, {Name: "a", Addr: "3:3"}}
	if err := r.SetMembers(dup); !errors.Is(err, ErrDuplicateMember) {
		t.Fatalf("duplicate names: err = %v", err)
	}
	if err := r.SetMembers([]Member{{Name: "", Addr: "1:1"}}); err == nil {
		t.Fatal("empty name accepted")
	}
	small := DefaultConfig()
	small.Partitions = 7
	if _, err := BuildTable(small, members(nil, 8)); err == nil {
		t.Fatal("8 members on 7 partitions accepted")
	}
	// Owners are 2-byte indexes: one member more than MaxMembers is
	// refused, before any placement work.
	if err := r.SetMembers(members(nil, MaxMembers+1)); err == nil || !strings.Contains(err.Error(), "more than 65536") {
		t.Fatalf("%d members: err = %v", MaxMembers+1, err)
	}
	if r.Table() != before {
		t.Fatal("a failed SetMembers replaced the table")
	}
}

func TestSetMembersKeepsInput(t *testing.T) {
	t.Parallel()
	ms := []Member{{Name: "c"}, {Name: "a"}, {Name: "b"}}
	orig := slices.Clone(ms)
	r := newRing(t, DefaultConfig(), ms)
	if !slices.Equal(ms, orig) {
		t.Fatalf("SetMembers reordered its argument: %v", ms)
	}
	got := r.Table().Members()
	if names := []string{got[0].Name, got[1].Name, got[2].Name}; !slices.Equal(names, []string{"a", "b", "c"}) {
		t.Fatalf("Members = %v, want sorted by name", got)
	}
	got[0].Name = "changed"
	if r.Table().Members()[0].Name != "a" {
		t.Fatal("Members returned the table's own slice")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for name, mod := range map[string]func(*Config){
		"zero partitions":     func(c *Config) { c.Partitions = 0 },
		"negative partitions": func(c *Config) { c.Partitions = -1 },
		"huge partitions":     func(c *Config) { c.Partitions = MaxPartitions + 1 },
		"zero R":              func(c *Config) { c.ReplicationFactor = 0 },
		"huge R":              func(c *Config) { c.ReplicationFactor = MaxReplicationFactor + 1 },
		"load 1":              func(c *Config) { c.Load = 1 },
		"load NaN":            func(c *Config) { c.Load = math.NaN() },
		"load Inf":            func(c *Config) { c.Load = math.Inf(1) },
		"zero vnodes":         func(c *Config) { c.VirtualNodes = 0 },
		"huge vnodes":         func(c *Config) { c.VirtualNodes = MaxVirtualNodes + 1 },
		"zero value":          func(c *Config) { *c = Config{} },
	} {
		cfg := DefaultConfig()
		mod(&cfg)
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, cfg)
		}
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	// Not parallel: AllocsPerRun counts allocations of the whole process.
	r := newRing(t, DefaultConfig(), members(nil, 5))
	dst := make([]Member, 0, 4)
	h := Hash("api", "user:1")
	var sink uint64
	for name, f := range map[string]func(){
		"Hash":     func() { sink ^= Hash("api.create_url", "user:42") },
		"Owner":    func() { _, _ = r.Owner(h) },
		"Replicas": func() { dst = r.Replicas(h, dst[:0]) },
		"Partition": func() {
			sink ^= uint64(r.Table().Partition(h))
		},
	} {
		if a := testing.AllocsPerRun(1000, f); a != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, a)
		}
	}
	_ = sink
}

// Lookups run while the membership changes; run with -race.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	r := newRing(t, DefaultConfig(), members(nil, 3))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 0))
			dst := make([]Member, 0, 2)
			for range 20_000 {
				h := rng.Uint64()
				if _, ok := r.Owner(h); !ok {
					t.Error("no owner while members change")
					return
				}
				dst = r.Replicas(h, dst[:0])
			}
		})
	}
	wg.Go(func() {
		for i := range 50 {
			if err := r.SetMembers(members(nil, 3+i%5)); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
}

// Small and odd configurations either build a complete table within the load
// bound or return an error; consistent's panics never escape.
func TestBuildTableSmallConfigs(t *testing.T) {
	t.Parallel()
	for _, parts := range []int{1, 2, 3, 7, 13, 31} {
		for n := 1; n <= parts+2; n++ {
			for _, vnodes := range []int{1, 2, 5} {
				for _, load := range []float64{1.001, 1.05, 1.25, 2} {
					cfg := Config{Partitions: parts, ReplicationFactor: 3, Load: load, VirtualNodes: vnodes}
					tab, err := BuildTable(cfg, members(nil, n))
					if err != nil {
						if n <= parts && vnodes > 1 {
							t.Errorf("%+v, %d members: %v", cfg, n, err)
						}
						continue
					}
					limit := int32(math.Ceil(float64(parts/n) * load))
					var total int32
					for i, c := range tab.owned {
						total += c
						if c > limit {
							t.Errorf("%+v, %d members: member %d owns %d > %d", cfg, n, i, c, limit)
						}
					}
					if total != int32(parts) {
						t.Errorf("%+v, %d members: %d of %d partitions owned", cfg, n, total, parts)
					}
				}
			}
		}
	}
}

func TestHashIsXXHashOfJoinedKeyAtEveryLength(t *testing.T) {
	t.Parallel()
	for n := 0; n <= 3*hashBufLen; n += 7 {
		name := strings.Repeat("n", 1+n%13)
		key := strings.Repeat("k", n)
		if got, want := Hash(name, key), xxhash.Sum64String(name+"\x00"+key); got != want {
			t.Fatalf("len %d: Hash %x, xxhash of joined key %x", n, got, want)
		}
	}
}

// TestModMatchesRemainder: the division-free partition of a hash is the
// remainder, for every partition count's edge cases and random hashes.
func TestModMatchesRemainder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 7, 271, 1021, 7919, 65536, MaxPartitions} {
		tab := &Table{partitions: uint64(n), recip: reciprocal(n)}
		hs := []uint64{0, 1, uint64(n) - 1, uint64(n), uint64(n) + 1, math.MaxUint64, math.MaxUint64 - 1, math.MaxUint64 - uint64(n)}
		for range 100_000 {
			hs = append(hs, rng.Uint64())
		}
		for _, h := range hs {
			if got, want := tab.mod(h), h%uint64(n); got != want {
				t.Fatalf("n %d: mod(%d) = %d, want %d", n, h, got, want)
			}
		}
	}
}

// TestHashJoinedIsXXH64: Hash is xxhash64 of the joined bytes for every
// split of every length up to 40, through each of its paths.
func TestHashJoinedIsXXH64(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	buf := make([]byte, 64)
	for total := 0; total <= 40; total++ {
		for split := 0; split <= total; split++ {
			for range 20 {
				for i := range buf {
					buf[i] = byte(rng.Uint32())
				}
				name, key := string(buf[:split]), string(buf[split:total])
				want := xxhash.Sum64([]byte(name + "\x00" + key))
				if got := Hash(name, key); got != want {
					t.Fatalf("Hash(%q, %q) = %x, want %x", name, key, got, want)
				}
			}
		}
	}
}

func FuzzHashIsXXH64(f *testing.F) {
	f.Add("api.create_url", "user:42")
	f.Add("", "")
	f.Add("12345678", "")
	f.Fuzz(func(t *testing.T, name, key string) {
		if got, want := Hash(name, key), xxhash.Sum64([]byte(name+"\x00"+key)); got != want {
			t.Fatalf("Hash(%q, %q) = %x, want %x", name, key, got, want)
		}
	})
}
