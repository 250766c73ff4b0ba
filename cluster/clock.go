package cluster

import (
	"sync/atomic"
	"time"
)

// wallClock tells the wall-clock time with one read of the monotonic clock
// (time.Since on a Time that carries a monotonic reading), where time.Now
// reads both clocks: it is on the path of every check. It adds the
// monotonic time elapsed since an anchor taken with time.Now, and takes a
// new anchor once a second, so it follows steps of the wall clock within a
// second and never drifts further than the two clocks do in a second.
type wallClock struct {
	anchor atomic.Pointer[time.Time]
}

// clockAnchorAge is how long an anchor is used.
const clockAnchorAge = time.Second

func newWallClock() *wallClock {
	c := &wallClock{}
	t := time.Now()
	c.anchor.Store(&t)
	return c
}

// Now returns the current wall-clock time.
func (c *wallClock) Now() time.Time {
	a := c.anchor.Load()
	d := time.Since(*a)
	if d < 0 || d >= clockAnchorAge {
		t := time.Now()
		c.anchor.Store(&t)
		return t
	}
	return a.Add(d)
}
