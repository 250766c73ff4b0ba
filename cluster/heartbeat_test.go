package cluster

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestBeatLoopStopsWhenIdle runs beatLoop on synctest's clock: it beats
// every period while the activity count moves, stops idleAfter after the
// last change (no beat however long nothing happens), beats again once
// woken, and returns when stopped.
func TestBeatLoopStopsWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period, idleAfter = 50 * time.Millisecond, time.Second
		var activity, beats atomic.Uint64
		var idle atomic.Bool
		stop, wake := make(chan struct{}), make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			beatLoop(stop, wake, period, idleAfter, activity.Load,
				func(time.Time) { beats.Add(1) }, idle.Store)
			close(done)
		}()

		// Busy: a check at 75 ms and every 100 ms after (never at a tick),
		// the last at 1975 ms; a beat at every tick, 50 ms to 1950 ms.
		time.Sleep(75 * time.Millisecond)
		activity.Add(1)
		for range 19 {
			time.Sleep(100 * time.Millisecond)
			activity.Add(1)
		}
		synctest.Wait()
		if busy := beats.Load(); busy != 39 {
			t.Fatalf("%d beats by 1975 ms at one per %v, want 39", busy, period)
		}
		// Quiet: the tick at 2000 ms sees the last check and beats; so do
		// the ticks to 2950 ms; the tick at 3000 ms, idleAfter after 2000 ms,
		// stops instead.
		time.Sleep(idleAfter + period) // to 3025 ms
		synctest.Wait()
		if !idle.Load() {
			t.Fatalf("not idle %v after the last check", idleAfter+period)
		}
		if quiet, want := beats.Load()-39, uint64(idleAfter/period); quiet != want {
			t.Fatalf("%d beats between the last check and idleness, want %d (idleAfter / period)", quiet, want)
		}
		at := beats.Load()
		time.Sleep(time.Hour)
		synctest.Wait()
		if beats.Load() != at {
			t.Fatalf("%d beats in an idle hour, want 0", beats.Load()-at)
		}
		// Woken: beating again, and idle again once quiet for idleAfter.
		wake <- struct{}{}
		synctest.Wait()
		if idle.Load() {
			t.Fatal("still idle after a wake")
		}
		time.Sleep(10 * period)
		synctest.Wait()
		if got := beats.Load() - at; got != 10 {
			t.Fatalf("%d beats in %v after the wake, want 10", got, 10*period)
		}
		time.Sleep(idleAfter)
		synctest.Wait()
		if !idle.Load() {
			t.Fatal("not idle again after a quiet idleAfter")
		}
		close(stop)
		<-done
	})
}

// TestBeatLoopZeroIdleAlwaysBeats: idleAfter 0 never stops.
func TestBeatLoopZeroIdleAlwaysBeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var beats atomic.Uint64
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			beatLoop(stop, make(chan struct{}), time.Second, 0, func() uint64 { return 0 },
				func(time.Time) { beats.Add(1) }, func(bool) { t.Error("idle with idleAfter 0") })
			close(done)
		}()
		time.Sleep(time.Hour + time.Millisecond)
		synctest.Wait()
		if beats.Load() != 3600 {
			t.Errorf("%d beats in an hour at one a second, want 3600", beats.Load())
		}
		close(stop)
		<-done
	})
}
