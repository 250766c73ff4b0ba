package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"time"
)

// The garbage collector's heap floor.
//
// Go starts a collection when the heap reaches live × (1 + GOGC/100), and
// never below 4 MiB. A node's live heap is small until it holds many keys
// (5–7 MiB under the load test with 10k keys), while every gRPC call
// allocates about 11 KB, so at GOGC=100 a node under load collects 20–30
// times a second and spends a fifth of its CPU on it (docs/performance.md).
// gcFloor raises GOGC while the live heap is small so that the heap goal
// stays at least a floor (--gc-min-heap, 64 MiB by default), and gives the
// process's own GOGC back once the live heap is large enough that the goal
// is above the floor anyway. A GOMEMLIMIT still applies: the runtime
// collects at whichever of the goal and the limit comes first.

// DefaultGCMinHeap is the default heap floor of `sluice serve` and
// `sluice bench` (--gc-min-heap).
const DefaultGCMinHeap = 64 << 20

// gcFloorInterval is how often the floor reads the live heap. A live heap
// that grows fast can overshoot the floor by what is allocated in one
// interval before GOGC comes back down.
const gcFloorInterval = 250 * time.Millisecond

// runtimeHeapMinimum is the Go runtime's smallest heap goal at GOGC=100;
// the runtime scales it by GOGC/100 (runtime/mgcpacer.go, heapMinimum), so
// at GOGC=p no goal is under runtimeHeapMinimum×p/100.
const runtimeHeapMinimum = 4 << 20

// maxGCPercent keeps the GOGC the floor sets within the runtime's int32.
const maxGCPercent = 1 << 30

// gcPercentFor returns the smallest GOGC whose heap goal is at least floor
// bytes, and never less than base (the process's own GOGC). The runtime's
// goal at GOGC=p is max(live×(1+p/100), runtimeHeapMinimum×p/100), so p is
// the smaller of what each term needs: with a tiny live heap (or none
// measured yet: live is 0 before the first collection) the second term
// decides. A negative base (GOGC=off) or a zero floor leaves base as it is.
func gcPercentFor(live, floor uint64, base int) int {
	if base < 0 || floor == 0 || live >= floor {
		return base
	}
	floor = min(floor, 1<<50) // so that 100×floor cannot overflow
	p := (100*floor + runtimeHeapMinimum - 1) / runtimeHeapMinimum
	if live > 0 {
		p = min(p, (100*(floor-live)+live-1)/live) // live + live*p/100 >= floor
	}
	return max(base, int(min(p, maxGCPercent)))
}

// gcFloor adjusts GOGC from the live heap. Its functions are the runtime's
// (newGCFloor) or a test's.
type gcFloor struct {
	floor uint64
	base  int               // the process's own GOGC
	every time.Duration     // how often run adjusts
	live  func() uint64     // live heap after the last collection, bytes
	set   func(percent int) // debug.SetGCPercent
	cur   int               // the GOGC set last
}

// newGCFloor returns a floor of floor bytes over the runtime's GC, with the
// process's GOGC (the GOGC environment variable, or 100) as base.
func newGCFloor(floor uint64) *gcFloor {
	base := 100
	if v, ok := os.LookupEnv("GOGC"); ok {
		base = parseGOGC(v)
	}
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	return &gcFloor{
		floor: floor,
		base:  base,
		every: gcFloorInterval,
		cur:   base,
		live: func() uint64 {
			metrics.Read(live)
			if live[0].Value.Kind() != metrics.KindUint64 {
				return math.MaxUint64 // unknown: leave GOGC alone
			}
			return live[0].Value.Uint64()
		},
		set: func(p int) { debug.SetGCPercent(p) },
	}
}

// parseGOGC reads a GOGC value as the runtime does: "off" is -1, a number is
// itself, anything else is the default, 100.
func parseGOGC(v string) int {
	if v == "off" {
		return -1
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 100
	}
	return n
}

// adjust sets GOGC for the live heap now; it changes it only when the new
// value differs from the last by more than a tenth, so a steady heap costs
// no calls into the runtime.
func (g *gcFloor) adjust() {
	p := gcPercentFor(g.live(), g.floor, g.base)
	if p == g.cur {
		return
	}
	if d := p - g.cur; p != g.base && d*10 < g.cur && -d*10 < g.cur {
		return
	}
	g.set(p)
	g.cur = p
}

// run adjusts GOGC at once and then every interval until ctx ends, and then
// gives the process's own GOGC back.
func (g *gcFloor) run(ctx context.Context) {
	if g.base < 0 || g.floor == 0 {
		return
	}
	g.adjust()
	t := time.NewTicker(g.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if g.cur != g.base {
				g.set(g.base)
				g.cur = g.base
			}
			return
		case <-t.C:
			g.adjust()
		}
	}
}

// byteSize is a flag value of bytes: a whole number with an optional unit,
// B, KiB, MiB or GiB (K, M, G and KB, MB, GB are read as the same powers of
// two).
type byteSize uint64

// String prints the size in the largest unit that divides it (64MiB).
func (b *byteSize) String() string {
	v := uint64(*b)
	for _, u := range []struct {
		name  string
		shift uint
	}{{"GiB", 30}, {"MiB", 20}, {"KiB", 10}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return strconv.FormatUint(v>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatUint(v, 10)
}

func (b *byteSize) Set(s string) error {
	v, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

func parseByteSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("%q: want a whole number of bytes, optionally with a unit (B, KiB, MiB, GiB)", s)
	}
	n, err := strconv.ParseUint(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: %w", s, err)
	}
	var shift uint
	switch strings.ToLower(strings.TrimSpace(t[i:])) {
	case "", "b":
	case "k", "kb", "kib":
		shift = 10
	case "m", "mb", "mib":
		shift = 20
	case "g", "gb", "gib":
		shift = 30
	default:
		return 0, fmt.Errorf("%q: unknown unit %q (want B, KiB, MiB or GiB)", s, strings.TrimSpace(t[i:]))
	}
	if n > math.MaxUint64>>shift {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n << shift, nil
}

// startGCFloor runs a heap floor of floor bytes (none when 0) until stop is
// called; stop waits for it and gives the process's GOGC back.
func startGCFloor(floor uint64) (stop func()) {
	if floor == 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	g := newGCFloor(floor)
	go func() {
		defer close(done)
		g.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}
