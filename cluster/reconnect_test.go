package cluster

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestWhileWorkSleepsWithoutWork: the reconnect loop's ticker runs only
// while there is something to look for (a member declared dead): none in
// an idle hour, every d once woken with work, none again once the work is
// gone, and a wake sent while it was busy costs one look, not a tick.
func TestWhileWorkSleepsWithoutWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = 2 * time.Second
		var work atomic.Bool
		var calls, looks atomic.Uint64
		stop, wake := make(chan struct{}), make(chan struct{}, 1)
		done := make(chan struct{})
		go func() {
			whileWork(stop, wake, d, func() bool { looks.Add(1); return work.Load() }, func() { calls.Add(1) })
			close(done)
		}()
		defer func() { close(stop); <-done }()
		signal := func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}

		time.Sleep(time.Hour)
		synctest.Wait()
		if calls.Load() != 0 || looks.Load() != 1 {
			t.Fatalf("idle hour: %d calls, %d looks at the work, want 0 and 1", calls.Load(), looks.Load())
		}
		work.Store(true) // a member is declared dead
		signal()
		time.Sleep(5*d + d/2)
		synctest.Wait()
		if calls.Load() != 5 {
			t.Fatalf("%d calls in 5.5 intervals with work, want 5", calls.Load())
		}
		signal() // another death while busy: left in the channel
		work.Store(false)
		time.Sleep(d)
		synctest.Wait()
		at := calls.Load()
		time.Sleep(time.Hour)
		synctest.Wait()
		if calls.Load() != at {
			t.Fatalf("%d calls in an idle hour after the work, want 0", calls.Load()-at)
		}
	})
}
