package ring

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	measure       = flag.Bool("ring.measure", false, "print the balance and movement table for docs/ring.md")
	measureParts  = flag.String("ring.partitions", "271,1021,7919", "partition counts for -ring.measure")
	measureLoads  = flag.String("ring.loads", "1.05,1.08,1.10,1.25", "Load factors for -ring.measure")
	measureVNodes = flag.String("ring.vnodes", "40,100", "virtual node counts for -ring.measure")
	measureSets   = flag.Int("ring.sets", 20, "random member-name sets per member count for -ring.measure")
)

func numbers[T int | float64](tb testing.TB, list string) []T {
	tb.Helper()
	var out []T
	for f := range strings.SplitSeq(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil {
			tb.Fatalf("bad number %q in %q", f, list)
		}
		out = append(out, T(v))
	}
	return out
}

// TestMeasure prints the table in docs/ring.md. Run:
//
//	go test ./ring/ -run TestMeasure -v -args -ring.measure [-ring.partitions 271,1021,7919] [-ring.loads 1.05,1.10] [-ring.vnodes 40,100] [-ring.sets 20]
func TestMeasure(t *testing.T) {
	if !*measure {
		t.Skip("pass -args -ring.measure to print the table")
	}
	sets := *measureSets // random name sets per member count, plus node-0..node-N
	fmt.Println("| Partitions | Load | VirtualNodes | balance max/mean (worst) | add: moved×(N+1) mean / worst | add: old→old worst | remove: moved×N mean / worst | remove: survivor→survivor worst | build 16 members |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, parts := range numbers[int](t, *measureParts) {
		for _, load := range numbers[float64](t, *measureLoads) {
			for _, vnodes := range numbers[int](t, *measureVNodes) {
				cfg := DefaultConfig()
				cfg.Partitions, cfg.Load, cfg.VirtualNodes = parts, load, vnodes
				var bal, addMax, addSum, addBetween, remMax, remSum, remBetween float64
				var runs int
				for n := 3; n <= 16; n++ {
					for s := 0; s <= sets; s++ {
						var rng *rand.Rand
						if s > 0 {
							rng = rand.New(rand.NewPCG(uint64(n), uint64(s)))
						}
						all := members(rng, n+1)
						old := mustTable(t, cfg, all[:n])
						grown := mustTable(t, cfg, all)
						bal = max(bal, balance(old), balance(grown))
						moved, between := movement(old, grown)
						addSum += moved * float64(n+1)
						addMax = max(addMax, moved*float64(n+1))
						addBetween = max(addBetween, between)
						// Remove one member of the n (the one at index s mod n).
						less := slices.Delete(slices.Clone(all[:n]), s%n, s%n+1)
						shrunk := mustTable(t, cfg, less)
						moved, between = movement(old, shrunk)
						remSum += moved * float64(n)
						remMax = max(remMax, moved*float64(n))
						remBetween = max(remBetween, between)
						runs++
					}
				}
				ms := members(nil, 16)
				start := time.Now()
				const builds = 20
				for range builds {
					mustTable(t, cfg, ms)
				}
				build := time.Since(start) / builds
				fmt.Printf("| %d | %.2f | %d | %.3f | %.2f / %.2f | %.3f | %.2f / %.2f | %.3f | %v |\n",
					parts, load, vnodes, bal, addSum/float64(runs), addMax, addBetween,
					remSum/float64(runs), remMax, remBetween, build.Round(10*time.Microsecond))
			}
		}
	}
}

var (
	measureLarge     = flag.Int("ring.large", 0, "member count for -ring.measure's large-cluster table (TestMeasureLarge); 0 skips it")
	measureLargeSets = flag.Int("ring.largesets", 5, "random member-name sets for TestMeasureLarge")
)

// TestMeasureLarge prints, for a cluster of -ring.large members, how many
// partitions change owner when one member joins or one leaves, as a
// multiple of the ideal 1/N, for each partition count and load factor of
// -ring.partitions and -ring.loads (docs/ring.md, docs/scaling.md). The
// tables come from a Ring (place.go), which computes consistent's
// placement without consistent's rebuild, so 1,000 members take seconds.
// Run:
//
//	go test ./ring/ -run TestMeasureLarge -v -args -ring.measure -ring.large 1000 -ring.partitions 7919,65521 -ring.loads 1.05,1.25
func TestMeasureLarge(t *testing.T) {
	if !*measure || *measureLarge == 0 {
		t.Skip("pass -args -ring.measure -ring.large N to print the table")
	}
	n := *measureLarge
	fmt.Printf("%d members, %d random name sets; a join or leave's moved partitions × N (mean / worst)\n\n", n, *measureLargeSets)
	fmt.Println("| Partitions | Load | partitions per member | balance max/mean (worst) | add: moved×(N+1) mean / worst | remove: moved×N mean / worst |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, parts := range numbers[int](t, *measureParts) {
		for _, load := range numbers[float64](t, *measureLoads) {
			cfg := DefaultConfig()
			cfg.Partitions, cfg.Load = parts, load
			if parts < n+1 {
				continue
			}
			var bal, addSum, addMax, remSum, remMax float64
			sets := *measureLargeSets
			for s := 1; s <= sets; s++ {
				all := members(rand.New(rand.NewPCG(uint64(n), uint64(s))), n+1)
				r, err := New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				table := func(ms []Member) *Table {
					if err := r.SetMembers(ms); err != nil {
						t.Fatal(err)
					}
					return r.Table()
				}
				old := table(all[:n])
				grown := table(all)
				moved, _ := movement(old, grown)
				addSum += moved * float64(n+1)
				addMax = max(addMax, moved*float64(n+1))
				table(all[:n])
				shrunk := table(slices.Delete(slices.Clone(all[:n]), s%n, s%n+1))
				moved, _ = movement(old, shrunk)
				remSum += moved * float64(n)
				remMax = max(remMax, moved*float64(n))
				bal = max(bal, balance(old), balance(grown))
			}
			fmt.Printf("| %d | %.2f | %.1f | %.3f | %.2f / %.2f | %.2f / %.2f |\n",
				parts, load, float64(parts)/float64(n), bal, addSum/float64(sets), addMax, remSum/float64(sets), remMax)
		}
	}
}
