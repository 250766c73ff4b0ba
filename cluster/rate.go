package cluster

import (
	"math"
	"runtime"
	"sync/atomic"
	"time"
)

// rateLoop measures, every second, the checks per second this node
// received (status) and its CPU load (Load, for elastic limits). It stops
// after a second without a check or a peer's check call, with the rate at
// 0 and the load of that quiet second, and the next check or peer call
// starts it again (wakeRate): an idle node's meter does not wake it.
func (n *Node) rateLoop() {
	defer n.wg.Done()
	last, lastAt, lastCPU := n.stats.checks.Load(), time.Now(), cpuTime()
	meterLoop(n.stop, n.meter.wake, &n.meter.idle, time.Second,
		func() uint64 { return n.stats.checks.Load() + n.stats.answered.Load() },
		func(now time.Time) {
			// The checks that woke it count in the first second after.
			lastAt, lastCPU = now, cpuTime()
		},
		func(now time.Time) {
			c, cpu := n.stats.checks.Load(), cpuTime()
			wall := now.Sub(lastAt)
			n.meter.rate.Store(math.Float64bits(float64(c-last) / wall.Seconds()))
			load := float64(cpu-lastCPU) / (float64(wall) * float64(runtime.GOMAXPROCS(0)))
			n.load.Store(math.Float64bits(min(max(load, 0), 1)))
			last, lastAt, lastCPU = c, now, cpu
		})
}

// wakeRate starts the rate meter again if it stopped; called after a
// check or a peer call raised the activity count. Busy, it is one atomic
// load.
func (n *Node) wakeRate() {
	if n.meter.idle.Load() && n.meter.idle.CompareAndSwap(true, false) {
		n.meter.wake <- struct{}{} // capacity 1, and only the one who cleared idle sends
	}
}

// meterLoop calls sample every period until stop closes. After a period
// in which activity() did not change, it sets idle and waits on wake, sent
// once by whoever clears idle (wakeRate); woken, it calls resume and
// samples again, the first time whether or not activity changes after. The loop sets idle before its last read of activity
// and the caller raises activity before it reads idle, so one of the two
// sees the other: a raise is never missed, and no wake is left over.
func meterLoop(stop <-chan struct{}, wake <-chan struct{}, idle *atomic.Bool, period time.Duration,
	activity func() uint64, resume, sample func(now time.Time)) {
	t := time.NewTicker(period)
	defer t.Stop()
	last := activity()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			sample(now)
			a := activity()
			if a != last {
				last = a
				continue
			}
			idle.Store(true)
			if activity() != last && idle.CompareAndSwap(true, false) {
				last = activity()
				continue
			}
			t.Stop()
			select {
			case <-stop:
				return
			case <-wake:
			}
			resume(time.Now())
			t.Reset(period)
		}
	}
}
