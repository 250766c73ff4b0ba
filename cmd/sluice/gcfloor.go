package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
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
// stays at least a floor, and gives the process's own GOGC back once the
// live heap is large enough that the goal is above the floor anyway. The
// floor is sized to the traffic: room for what the process allocated in
// the last second (gcFloorSpan), at most --gc-min-heap (64 MiB by
// default). So a node under load collects about once a second, as with a
// fixed floor, while an idle node, which allocates little, keeps GOGC and
// a heap of a few MiB instead of letting garbage grow to 64 MiB. Above
// the floor the same rule lowers GOGC, down to gcMinPercent, for a large
// live heap that allocation does not need room for (a quiet node holding
// many keys). It
// adjusts after every collection, when the runtime measures the live heap
// anew, and otherwise every gcFloorRecheck, so that a floor raised by a
// burst comes down once the node is quiet although no collection follows
// (an idle heap would not reach the raised goal). A GOMEMLIMIT still applies: the runtime
// collects at whichever of the goal and the limit comes first.

// DefaultGCMinHeap is the default heap floor of `sluice serve` and
// `sluice bench` (--gc-min-heap).
const DefaultGCMinHeap = 64 << 20

// gcFloorSpan is how many seconds of allocation the floor makes room for:
// below --gc-min-heap, a collection about once per span.
const gcFloorSpan = time.Second

// gcFloorRecheck is how often the floor is recomputed between collections.
const gcFloorRecheck = 10 * time.Second

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

// gcFloor adjusts GOGC from the live heap and the allocation rate. Its
// functions are the runtime's (newGCFloor) or a test's.
type gcFloor struct {
	floor  uint64            // the largest floor (--gc-min-heap)
	base   int               // the process's own GOGC
	span   time.Duration     // seconds of allocation the floor makes room for
	every  time.Duration     // recheck interval without collections
	sample func() heapSample // the heap now
	set    func(percent int) // debug.SetGCPercent
	cur    int               // the GOGC set last
	last   heapSample        // at the previous adjustment
	// release returns the free heap to the system (debug.FreeOSMemory;
	// nil: never), when shouldRelease says so; released is when it last did.
	release  func()
	released time.Time
}

// heapSample is what the floor reads of the heap.
type heapSample struct {
	live   uint64    // live heap after the last collection, bytes
	allocs uint64    // bytes allocated since the process started
	free   uint64    // heap memory held from the system with nothing in it, bytes
	at     time.Time // when read
}

// newGCFloor returns a floor of floor bytes over the runtime's GC, with the
// process's GOGC (the GOGC environment variable, or 100) as base.
func newGCFloor(floor uint64) *gcFloor {
	base := 100
	if v, ok := os.LookupEnv("GOGC"); ok {
		base = parseGOGC(v)
	}
	ms := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}, {Name: "/memory/classes/heap/free:bytes"}}
	return &gcFloor{
		floor: floor,
		base:  base,
		span:  gcFloorSpan,
		every: gcFloorRecheck,
		cur:   base,
		sample: func() heapSample {
			metrics.Read(ms)
			s := heapSample{live: math.MaxUint64, at: time.Now()} // unknown: leave GOGC alone
			if ms[0].Value.Kind() == metrics.KindUint64 && ms[1].Value.Kind() == metrics.KindUint64 {
				s.live, s.allocs = ms[0].Value.Uint64(), ms[1].Value.Uint64()
			}
			if ms[2].Value.Kind() == metrics.KindUint64 {
				s.free = ms[2].Value.Uint64()
			}
			return s
		},
		set:     func(p int) { debug.SetGCPercent(p) },
		release: debug.FreeOSMemory,
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

// floorFor returns the floor for the heap now: room above the live heap
// for what was allocated in one span at the rate since the previous
// sample, at most g.floor.
func (g *gcFloor) floorFor(s heapSample) uint64 {
	room, ok := g.room(s)
	if !ok || room >= g.floor {
		return g.floor
	}
	return min(g.floor, s.live+room)
}

// room returns what was allocated in one span at the rate since the
// previous sample; false when it cannot tell.
func (g *gcFloor) room(s heapSample) (uint64, bool) {
	dt := s.at.Sub(g.last.at)
	if dt <= 0 || s.allocs < g.last.allocs || s.live == math.MaxUint64 {
		return 0, false
	}
	r := float64(s.allocs-g.last.allocs) * float64(g.span) / float64(dt)
	return uint64(min(r, 1<<62)), true
}

// gcMinPercent is the least GOGC the floor sets for a live heap above
// --gc-min-heap: a quiet node holding many keys keeps a quarter of its
// live heap as headroom instead of all of it.
const gcMinPercent = 25

// percentAbove returns GOGC for a live heap of at least the floor: the
// headroom one span of allocation needs, between gcMinPercent and the
// process's GOGC. A node under load keeps GOGC; a quiet one holds a
// quarter of its live heap in garbage instead of as much again.
func (g *gcFloor) percentAbove(s heapSample) int {
	room, ok := g.room(s)
	if !ok || g.base <= gcMinPercent || s.live < g.floor || s.live == 0 {
		return g.base
	}
	p := (100*min(room, 1<<50) + s.live - 1) / s.live
	return int(max(gcMinPercent, min(p, uint64(g.base))))
}

// adjust sets GOGC for the heap now; it changes it only when the new value
// differs from the last by more than a tenth, so a steady heap costs no
// calls into the runtime.
func (g *gcFloor) adjust() {
	s := g.sample()
	p := gcPercentFor(s.live, g.floorFor(s), g.base)
	if s.live >= g.floor {
		p = g.percentAbove(s)
	}
	if g.shouldRelease(s) {
		g.release() // a collection: the next adjustment follows it
		g.released = s.at
	}
	g.last = s
	if p == g.cur {
		return
	}
	if d := p - g.cur; p != g.base && d*10 < g.cur && -d*10 < g.cur {
		return
	}
	g.set(p)
	g.cur = p
}

// run adjusts GOGC whenever cycles delivers (after each collection) until
// ctx ends, and then gives the process's own GOGC back. Until the first
// collection the process's GOGC applies: the runtime's 4 MiB minimum goal.
// Between collections it adjusts every g.every.
func (g *gcFloor) run(ctx context.Context, cycles <-chan struct{}) {
	if g.base < 0 || g.floor == 0 {
		return
	}
	g.last = g.sample()
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
		case <-cycles:
			g.adjust()
			t.Reset(g.every)
		case <-t.C:
			g.adjust()
		}
	}
}

// notifyGC sends on ch, without blocking, after every garbage collection
// until done is closed: an object that nothing references is finalized
// by the collection after it is allocated, and its finalizer allocates
// the next one.
func notifyGC(ch chan<- struct{}, done <-chan struct{}) {
	type canary struct{ _ *byte } // holds a pointer, so it is never batched in a tiny block
	c := &canary{}
	runtime.SetFinalizer(c, func(*canary) {
		select {
		case <-done:
			return
		default:
		}
		select {
		case ch <- struct{}{}:
		default: // the floor has not caught up with the previous one
		}
		notifyGC(ch, done)
	})
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
	cycles := make(chan struct{}, 1)
	notifyGC(cycles, ctx.Done())
	g := newGCFloor(floor)
	go func() {
		defer close(done)
		g.run(ctx, cycles)
	}()
	return func() {
		cancel()
		<-done
	}
}
