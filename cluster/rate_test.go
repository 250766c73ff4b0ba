package cluster

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// meterRig runs meterLoop on synctest's clock with an activity count that
// raises and wakes the way Node.wakeRate does.
type meterRig struct {
	activity, resumes, samples atomic.Uint64
	idle                       atomic.Bool
	stop                       chan struct{}
	wake                       chan struct{}
	done                       chan struct{}
}

func startMeter(period time.Duration) *meterRig {
	r := &meterRig{stop: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		meterLoop(r.stop, r.wake, &r.idle, period, r.activity.Load,
			func(time.Time) { r.resumes.Add(1) }, func(time.Time) { r.samples.Add(1) })
		close(r.done)
	}()
	return r
}

// close stops the loop and waits for it to return.
func (r *meterRig) close() {
	close(r.stop)
	<-r.done
}

// raise is a check: the count, then the wake if the meter stopped.
func (r *meterRig) raise() {
	r.activity.Add(1)
	if r.idle.Load() && r.idle.CompareAndSwap(true, false) {
		r.wake <- struct{}{}
	}
}

// TestMeterLoopStopsWhenIdle: the rate meter samples every period while
// checks come, stops after one period without any (no sample however long
// nothing happens), starts again at the next check and stops again once
// quiet.
func TestMeterLoopStopsWhenIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = time.Second
		r := startMeter(period)
		defer r.close()
		// A check every 250 ms for 5 s (never at a tick): a sample a second.
		for range 20 {
			time.Sleep(250*time.Millisecond + time.Millisecond/20)
			r.raise()
		}
		synctest.Wait()
		if got := r.samples.Load(); got != 5 {
			t.Fatalf("%d samples in 5 busy seconds, want 5", got)
		}
		// The tick at 6 s sees the checks since 5 s; the one at 7 s sees
		// none and stops the meter.
		time.Sleep(2 * period)
		synctest.Wait()
		if !r.idle.Load() {
			t.Fatal("not idle after a quiet second")
		}
		at := r.samples.Load()
		if at != 7 {
			t.Fatalf("%d samples at idleness, want 7", at)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if r.samples.Load() != at {
			t.Fatalf("%d samples in an idle hour, want 0", r.samples.Load()-at)
		}
		// A check starts it again, then a sample a second.
		r.raise()
		synctest.Wait()
		if r.idle.Load() || r.resumes.Load() != 1 {
			t.Fatalf("after a check: idle %v, %d resumes, want running and 1", r.idle.Load(), r.resumes.Load())
		}
		time.Sleep(3*period + period/2)
		synctest.Wait()
		if got := r.samples.Load() - at; got != 2 {
			// the first tick sees the waking check, the second sees none and stops
			t.Fatalf("%d samples after the wake, want 2", got)
		}
		if !r.idle.Load() {
			t.Fatal("not idle again after a quiet second")
		}
	})
}

// TestMeterLoopMissesNoCheck: checks raised around the moment the meter
// goes idle, from many goroutines, always leave it either running or
// woken: after the last one it samples again.
func TestMeterLoopMissesNoCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = 10 * time.Millisecond
		r := startMeter(period)
		defer r.close()
		for round := range 200 {
			// Quiet long enough to stop, then checks at and around the tick.
			time.Sleep(2*period + time.Duration(round%3)*time.Millisecond/2)
			for range 4 {
				go r.raise()
			}
			synctest.Wait()
			before := r.samples.Load()
			time.Sleep(period + time.Millisecond)
			synctest.Wait()
			if r.samples.Load() == before {
				t.Fatalf("round %d: no sample within a period of the checks (idle %v)", round, r.idle.Load())
			}
		}
	})
}
