package main

import "time"

// Giving free heap back to the system when the node is quiet.
//
// The runtime keeps the heap pages it freed and returns them slowly: its
// scavenger retains up to 10 % above the heap goal of the last completed
// collection, and a quiet node collects rarely, so the goal of the last busy
// moment stays. After a million new keys, three nodes held 90–100 MB of free
// heap each a minute after the load (docs/performance.md): a third of
// their RSS. So when a quiet node holds much more free heap than its floor
// keeps as headroom, the floor asks the runtime to return it
// (debug.FreeOSMemory: one collection, then every free page). Like the
// floor, it is off with --gc-min-heap 0 or GOGC=off.

// gcReleaseMin is the least free heap worth returning.
const gcReleaseMin = 16 << 20

// gcReleaseEvery is the least time between two returns: each costs a
// collection.
const gcReleaseEvery = time.Minute

// shouldRelease reports whether the free heap of s should be returned now:
// it is at least gcReleaseMin and more than a quarter of the live heap (the
// headroom a quiet node keeps, gcMinPercent), the process allocated less
// than a quarter of it in the last span (so it would not take it back soon)
// and no return happened within gcReleaseEvery. g.last must still be the
// previous sample.
func (g *gcFloor) shouldRelease(s heapSample) bool {
	if g.release == nil || s.free < gcReleaseMin || s.free <= s.live/4 {
		return false
	}
	if !g.released.IsZero() && s.at.Sub(g.released) < gcReleaseEvery {
		return false
	}
	room, ok := g.room(s)
	return ok && room < s.free/4
}
