package cluster

import "time"

// beatLoop calls beat every period while the node is busy, and stops when
// it is idle: once activity() (a count that any check or peer call
// raises) has not changed for idleAfter (> 0; 0 never stops), it calls
// idle(true), stops its ticker and waits for wake or stop; woken, it calls
// idle(false) and beats again. It returns when stop closes.
//
// The pause heartbeat (pause.go) is what it drives: a beat every
// ForwardTimeout/4 is most of an idle node's wake-ups. Stopping it is safe
// because the heartbeat decides nothing: each decision compares its own
// now with the last beat, and a gap left by a stopped heartbeat is handled
// like a pause (noticePause), which also wakes the loop. A wake that came
// while the loop was beating is left in the channel and ends its next idle
// spell at once: one more round of beats, nothing worse.
func beatLoop(stop, wake <-chan struct{}, period, idleAfter time.Duration,
	activity func() uint64, beat func(now time.Time), idle func(bool)) {
	t := time.NewTicker(period)
	defer t.Stop()
	last, quietSince := activity(), time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			if a := activity(); a != last {
				last, quietSince = a, now
			} else if idleAfter > 0 && now.Sub(quietSince) >= idleAfter {
				t.Stop()
				idle(true)
				select {
				case <-stop:
					return
				case <-wake:
				}
				idle(false)
				last, quietSince = activity(), time.Now()
				t.Reset(period)
				continue
			}
			beat(now)
		}
	}
}
