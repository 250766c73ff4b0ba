package cluster

import (
	"testing"
	"time"
)

func TestWallClockFollowsTimeNow(t *testing.T) {
	t.Parallel()
	c := newWallClock()
	for range 1000 {
		before := time.Now()
		got := c.Now()
		after := time.Now()
		// The clocks may disagree by what they drift apart in a second:
		// far below a millisecond on any sane machine.
		if got.Before(before.Add(-time.Millisecond)) || got.After(after.Add(time.Millisecond)) {
			t.Fatalf("wallClock %v outside [%v, %v]", got, before, after)
		}
	}
}

func TestWallClockReanchors(t *testing.T) {
	t.Parallel()
	c := newWallClock()
	old := time.Now().Add(-2 * clockAnchorAge)
	c.anchor.Store(&old)
	now := c.Now()
	if a := c.anchor.Load(); a.Equal(old) || a.Before(now.Add(-time.Second)) {
		t.Fatalf("anchor %v not replaced after %v", a, clockAnchorAge)
	}
	if d := time.Since(now); d < 0 || d > time.Second {
		t.Fatalf("Now %v is %v from time.Now", now, d)
	}
}

func BenchmarkClock(b *testing.B) {
	c := newWallClock()
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			_ = time.Now().UnixNano()
		}
	})
	b.Run("wallClock", func(b *testing.B) {
		for b.Loop() {
			_ = c.Now().UnixNano()
		}
	})
}
