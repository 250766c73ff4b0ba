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
