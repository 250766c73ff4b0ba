package bucket

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// refundLimits are the limits a lease is given for.
func refundLimits() []Limit {
	return []Limit{
		{Algorithm: FixedWindow, Limit: 100, WindowMS: 1000},
		{Algorithm: SlidingWindow, Limit: 100, WindowMS: 1000},
		{Algorithm: TokenBucket, Limit: 100, WindowMS: 1000},
		{Algorithm: TokenBucket, Limit: 7, WindowMS: 300, Burst: 40},
	}
}

// TestRefundUndoesAGrant: a grant of h hits at g of which k are given back
// at t leaves the state deciding every later request exactly as one where
// only the h−k spent hits were admitted at g — while the state still counts
// the grant's window (fixed: the same window; sliding: the same or the
// next; bucket: any time). After that nothing is taken back.
func TestRefundUndoesAGrant(t *testing.T) {
	t.Parallel()
	for _, lim := range refundLimits() {
		t.Run(fmt.Sprintf("%v/%d/%d/%d", lim.Algorithm, lim.Limit, lim.WindowMS, lim.Burst), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(1, uint64(lim.Limit)))
			w := lim.WindowMS * nsPerMS
			taken := 0
			for range 5000 {
				g := t0 + rng.Int64N(3*w)
				pre := rng.Int64N(lim.Limit/2 + 1)
				var act, shadow State
				if pre > 0 {
					Decide(&act, lim, pre, g-rng.Int64N(w/2))
					shadow = act
				}
				h := 1 + rng.Int64N(lim.Limit/2)
				k := rng.Int64N(h + 1)
				if !Decide(&act, lim, h, g).Allowed() {
					continue
				}
				if h-k > 0 && !Decide(&shadow, lim, h-k, g).Allowed() {
					t.Fatalf("shadow refused %d where %d was admitted", h-k, h)
				}
				tt := g + rng.Int64N(2*w)
				if lim.Algorithm == TokenBucket {
					tt = g + rng.Int64N(w/5) // later it has refilled anyway
				}
				if lim.Algorithm != TokenBucket && rng.IntN(2) == 0 {
					// Another check between the grant and the refund
					// (in the next window, the sliding window's count
					// moves to its previous one). Not for the bucket: a
					// bucket without the grant may have filled up and
					// wasted refill that the leased one kept, so the two
					// part ways; its bound is the cumulative one the
					// lease model checks (cluster/lease).
					m := g + rng.Int64N(tt-g+1)
					x := 1 + rng.Int64N(lim.Limit/4)
					if Decide(&act, lim, x, m).Allowed() != Decide(&shadow, lim, x, m).Allowed() {
						continue // the two states part ways: nothing to compare
					}
				}
				peek := act
				level := Decide(&peek, lim, 0, tt).Remaining
				back := Refund(&act, &lim, k, g, tt)
				if back < 0 || back > k {
					t.Fatalf("refund of %d gave back %d", k, back)
				}
				gw, tw := g-g%w, tt-tt%w
				counts := lim.Algorithm == TokenBucket || gw == tw ||
					lim.Algorithm == SlidingWindow && tw == gw+w
				if counts && back != k && lim.Algorithm != TokenBucket {
					t.Fatalf("grant %d at %d, refund %d at %d (same window): gave back %d", h, g, k, tt, back)
				}
				if b := max(lim.Burst, lim.Limit); lim.Algorithm == TokenBucket && back != min(k, b-level) {
					t.Fatalf("bucket holding %d of %d at %d: refund of %d gave back %d", level, b, tt, k, back)
				}
				if !counts && back != 0 {
					t.Fatalf("grant at %d, refund at %d (window gone): gave back %d", g, tt, back)
				}
				if back > 0 {
					taken++
				}
				// From tt on, act decides as shadow would, or — when less
				// came back (a bucket full by then, a window gone) — never
				// admits what shadow refuses.
				for i := range 20 {
					now := tt + int64(i)*w/10
					hits := 1 + rng.Int64N(lim.Limit/3+1)
					da, ds := Decide(&act, lim, hits, now), Decide(&shadow, lim, hits, now)
					if da.Allowed() && !ds.Allowed() {
						t.Fatalf("after a refund of %d (back %d) at %d: admitted %d at %d that the state without the grant refuses", k, back, tt, hits, now)
					}
					if back == k && da != ds {
						t.Fatalf("after a full refund of %d at %d: %+v, without the grant %+v (hits %d at %d)", k, tt, da, ds, hits, now)
					}
				}
			}
			if taken < 1000 {
				t.Fatalf("only %d of 5000 refunds took anything back", taken)
			}
		})
	}
}

// TestRefundLeavesOtherLimitsAlone: limits that are never leased take
// nothing back.
func TestRefundLeavesOtherLimitsAlone(t *testing.T) {
	t.Parallel()
	for _, lim := range []Limit{
		{Algorithm: SlidingLog, Limit: 10, WindowMS: 1000},
		{Algorithm: GCRA, Limit: 10, WindowMS: 1000},
		{Algorithm: LeakyBucket, Limit: 10, WindowMS: 1000},
		{Algorithm: FixedWindow, Limit: 10, WindowMS: 1000, Mode: ModeSoft, SoftPercent: 10},
		{Algorithm: FixedWindow, Limit: 10, WindowMS: 1000, CountRefused: true},
		{Algorithm: SlidingWindow, Limit: 10, WindowMS: 1000, SubWindows: 4},
	} {
		var s State
		Decide(&s, lim, 5, t0)
		before := s
		if back := Refund(&s, &lim, 3, t0, t0+1); back != 0 || s != before {
			t.Errorf("%+v: refund gave back %d, state %+v -> %+v", lim, back, before, s)
		}
	}
}
