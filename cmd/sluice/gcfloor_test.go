package main

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestGCPercentFor(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	for _, tc := range []struct {
		live, floor uint64
		base, want  int
	}{
		{live: 5 * mib, floor: 64 * mib, base: 100, want: 1180}, // 5 MiB × 12.8 = 64 MiB
		{live: 32 * mib, floor: 64 * mib, base: 100, want: 100}, // the goal is the floor already
		{live: 16 * mib, floor: 64 * mib, base: 100, want: 300},
		{live: 16 * mib, floor: 64 * mib, base: 400, want: 400}, // never below the process's GOGC
		{live: 100 * mib, floor: 64 * mib, base: 100, want: 100},
		{live: 64 * mib, floor: 64 * mib, base: 50, want: 50},
		// The runtime never sets a goal under 4 MiB × GOGC/100, so with a
		// tiny (or not yet measured) live heap GOGC 1600 is the floor.
		{live: 3, floor: 64 * mib, base: 100, want: 1600},
		{live: 0, floor: 64 * mib, base: 100, want: 1600},
		{live: 0, floor: 2 * mib, base: 100, want: 100},
		{live: 1, floor: 1 << 63, base: 100, want: maxGCPercent}, // absurd floors stay in range
		{live: 5 * mib, floor: 0, base: 100, want: 100},          // no floor
		{live: 5 * mib, floor: 64 * mib, base: -1, want: -1},     // GOGC=off stays off
		{live: 3 * mib, floor: 10 * mib, base: 100, want: 234},   // rounded up: 3 × 3.34 ≥ 10
	} {
		got := gcPercentFor(tc.live, tc.floor, tc.base)
		if got != tc.want {
			t.Errorf("gcPercentFor(live %d, floor %d, base %d) = %d, want %d", tc.live, tc.floor, tc.base, got, tc.want)
		}
		if tc.base >= 0 && tc.floor > 0 && got > tc.base && got < maxGCPercent {
			// The heap goal the runtime derives: at least the floor, and
			// not above it by more than rounding.
			goal := max(tc.live+tc.live*uint64(got)/100, runtimeHeapMinimum*uint64(got)/100)
			if goal < tc.floor || goal > tc.floor+tc.floor/100 {
				t.Errorf("live %d at GOGC %d: goal %d, want the floor %d", tc.live, got, goal, tc.floor)
			}
		}
	}
}

// TestGCFloorFollowsTheLiveHeap runs the loop in a bubble against a fake
// runtime: after each collection GOGC goes up while the heap is small and
// the allocation rate high, is left alone for small changes, comes back to
// the base as the heap grows, comes down without a collection once the
// process is quiet, and is given back when the loop stops.
func TestGCFloorFollowsTheLiveHeap(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const mib = 1 << 20
		var mu sync.Mutex
		live, allocs := uint64(5*mib), uint64(0)
		var sets []int
		g := &gcFloor{
			floor: 64 * mib, base: 100, cur: 100, span: time.Second, every: 10 * time.Second,
			sample: func() heapSample {
				mu.Lock()
				defer mu.Unlock()
				return heapSample{live: live, allocs: allocs, at: time.Now()}
			},
			set: func(p int) { mu.Lock(); defer mu.Unlock(); sets = append(sets, p) },
		}
		cycles := make(chan struct{})
		// collect is a collection after a second in which the process
		// allocated alloc bytes and kept live.
		collect := func(l, alloc uint64) {
			time.Sleep(time.Second)
			mu.Lock()
			live, allocs = l, allocs+alloc
			mu.Unlock()
			cycles <- struct{}{}
			synctest.Wait()
		}
		got := func() []int { mu.Lock(); defer mu.Unlock(); return slices.Clone(sets) }

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { g.run(ctx, cycles); close(done) }()
		synctest.Wait()
		if len(got()) != 0 {
			t.Fatalf("before the first collection: set %v, want nothing", got())
		}
		collect(5*mib, 200*mib) // busy: the whole floor
		if want := []int{1180}; !slices.Equal(got(), want) {
			t.Fatalf("busy: set %v, want %v", got(), want)
		}
		collect(5*mib+mib/4, 200*mib) // 1120: within a tenth of 1180, no call
		if want := []int{1180}; !slices.Equal(got(), want) {
			t.Fatalf("after a small change: set %v, want %v", got(), want)
		}
		collect(16*mib, 200*mib)
		collect(200*mib, 200*mib)
		if want := []int{1180, 300, 100}; !slices.Equal(got(), want) {
			t.Fatalf("as the heap grew: set %v, want %v", got(), want)
		}
		collect(mib, 200*mib)
		collect(mib, 15*mib) // 15 MiB a second: a floor of 16 MiB
		if want := []int{1180, 300, 100, 1600, 400}; !slices.Equal(got(), want) {
			t.Fatalf("as the rate fell: set %v, want %v", got(), want)
		}
		// Quiet, no collection: the recheck brings GOGC back.
		mu.Lock()
		allocs += mib
		mu.Unlock()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if want := []int{1180, 300, 100, 1600, 400, 100}; !slices.Equal(got(), want) {
			t.Fatalf("quiet: set %v, want %v", got(), want)
		}
		collect(mib, 200*mib)
		cancel()
		<-done
		if want := []int{1180, 300, 100, 1600, 400, 100, 1600, 100}; !slices.Equal(got(), want) {
			t.Fatalf("after stop: set %v, want %v (the base given back)", got(), want)
		}
	})
}

func TestGCFloorOffDoesNothing(t *testing.T) {
	t.Parallel()
	for _, g := range []*gcFloor{
		{floor: 64 << 20, base: -1, cur: -1},
		{floor: 0, base: 100, cur: 100},
	} {
		g.sample = func() heapSample { return heapSample{live: 1} }
		g.set = func(p int) { t.Errorf("floor %d base %d: set GOGC %d, want no call", g.floor, g.base, p) }
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		g.run(ctx, nil) // returns at once
	}
}

// TestNotifyGCAfterEveryCollection: each collection delivers, and none
// after done is closed.
func TestNotifyGCAfterEveryCollection(t *testing.T) {
	ch := make(chan struct{}, 1)
	done := make(chan struct{})
	notifyGC(ch, done)
	for i := range 3 {
		deadline := time.After(10 * time.Second)
	wait:
		for {
			runtime.GC()
			select {
			case <-ch:
				break wait
			case <-deadline:
				t.Fatalf("collection %d: no notice within 10 s", i)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	close(done)
	runtime.GC()
	runtime.GC()
	select {
	case <-ch: // one finalizer may have run before done was closed
	default:
	}
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	select {
	case <-ch:
		t.Fatal("notice after done was closed")
	default:
	}
}

func TestParseGOGC(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"off": -1, "200": 200, "0": 0, "": 100, "lots": 100} {
		if got := parseGOGC(in); got != want {
			t.Errorf("parseGOGC(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestParseByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]uint64{
		"0": 0, "4096": 4096, "64MiB": 64 << 20, "64 MiB": 64 << 20, "64m": 64 << 20,
		"1GiB": 1 << 30, "512KiB": 512 << 10, "10B": 10, "2GB": 2 << 30,
	} {
		got, err := parseByteSize(in)
		if err != nil || got != want {
			t.Errorf("parseByteSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for in, wantErr := range map[string]string{
		"":                     "whole number",
		"MiB":                  "whole number",
		"-5":                   "whole number",
		"64TiB":                "unknown unit",
		"1.5GiB":               "unknown unit",
		"17179869184GiB":       "too large",
		"99999999999999999999": "out of range",
	} {
		if _, err := parseByteSize(in); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("parseByteSize(%q): error %v, want one containing %q", in, err, wantErr)
		}
	}
	for _, v := range []byteSize{0, 10, 64 << 20, 3 << 30, 1536} {
		s := v.String()
		back, err := parseByteSize(s)
		if err != nil || byteSize(back) != v {
			t.Errorf("%d printed as %q reads back as %d, %v", uint64(v), s, back, err)
		}
	}
}

func TestGCMinHeapFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want uint64
	}{
		{nil, DefaultGCMinHeap},
		{[]string{"--gc-min-heap", "256MiB"}, 256 << 20},
		{[]string{"--gc-min-heap", "0"}, 0},
	} {
		var f serveFlags
		if err := parseWithEnv(newServeFlagSet(&f), tc.args); err != nil {
			t.Fatal(err)
		}
		if uint64(f.gcMinHeap) != tc.want {
			t.Errorf("%v: gc-min-heap %d, want %d", tc.args, f.gcMinHeap, tc.want)
		}
	}
	var f serveFlags
	if err := parseWithEnv(newServeFlagSet(&f), []string{"--gc-min-heap", "lots"}); err == nil || !strings.Contains(err.Error(), "gc-min-heap") {
		t.Errorf("--gc-min-heap lots: error %v, want one naming the flag", err)
	}
}

// TestGCPercentAboveTheFloor: a live heap above the floor keeps the
// headroom one second of allocation needs, between a quarter of the live
// heap and the process's GOGC.
func TestGCPercentAboveTheFloor(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	t0 := time.Unix(0, 0)
	for _, tc := range []struct {
		live, alloced uint64 // live heap, bytes allocated in the second before
		base, want    int
	}{
		{200 * mib, 400 * mib, 100, 100}, // busy: GOGC
		{200 * mib, 100 * mib, 100, 50},  // half of it
		{200 * mib, mib, 100, 25},        // quiet: a quarter
		{200 * mib, mib, 20, 20},         // never above the process's GOGC
		{32 * mib, mib, 100, 100},        // under the floor: not this rule
	} {
		g := &gcFloor{floor: 64 * mib, base: tc.base, span: time.Second, last: heapSample{at: t0}}
		got := g.percentAbove(heapSample{live: tc.live, allocs: tc.alloced, at: t0.Add(time.Second)})
		if got != tc.want {
			t.Errorf("live %d MiB, %d MiB/s, GOGC %d: got %d, want %d", tc.live/mib, tc.alloced/mib, tc.base, got, tc.want)
		}
	}
}
