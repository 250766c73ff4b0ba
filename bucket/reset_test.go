package bucket

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestResetIsAFreshCounter: after random traffic, a Reset state decides
// every following request exactly as a fresh counter does, whatever the
// algorithm; it is not fresh before the forgotten count's expiry, it
// survives encoding, its epoch is the next one and Decide keeps it, and
// no copy of the forgotten count merges into it.
func TestResetIsAFreshCounter(t *testing.T) {
	t.Parallel()
	for _, kind := range algorithmKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(7, uint64(len(kind))))
			for range 40 {
				lim := randomAlgorithmLimit(rng, kind)
				lim.CountRefused = rng.IntN(3) == 0
				w := lim.WindowMS * nsPerMS
				now := int64(1_700_000_000_000_000_000) + rng.Int64N(w)
				var st State
				for range 1 + rng.IntN(50) {
					now += rng.Int64N(w/8 + 1)
					Decide(&st, lim, randomHits(rng, lim.Limit), now)
				}
				old := st
				if old.Fresh(now) {
					if got := Reset(old, now); !sameState(got, old) {
						t.Fatalf("%v: a fresh state was reset to %+v", lim, got)
					}
					continue
				}
				r := Reset(old, now)
				if r.Fresh(now) || r.Expires != old.Expires || r.Epoch != (old.Epoch+1)&MaxEpoch || r.Algorithm != old.Algorithm {
					t.Fatalf("%v: Reset(%+v) = %+v", lim, old, r)
				}
				if err := roundTrip(r); err != nil {
					t.Fatal(err)
				}
				if _, ok := Merge(r, old); ok {
					t.Fatalf("%v: the forgotten count merged into the reset", lim)
				}
				if _, ok := Merge(old, r); ok {
					t.Fatalf("%v: the reset merged into the forgotten count", lim)
				}
				var fresh State
				for i := range 200 {
					now += rng.Int64N(w/16 + 1)
					hits := randomHits(rng, lim.Limit)
					got, want := Decide(&r, lim, hits, now), Decide(&fresh, lim, hits, now)
					if got != want {
						t.Fatalf("%v: decision %d after the reset: %+v, a fresh counter %+v", lim, i, got, want)
					}
					if r.Epoch != (old.Epoch+1)&MaxEpoch {
						t.Fatalf("%v: Decide dropped the epoch: %+v", lim, r)
					}
				}
			}
		})
	}
}

// TestEpochsWrapAndEncode: sixteen resets bring the epoch back to 0, and
// each epoch encodes in the algorithm byte's high bits, so a state that
// was never reset encodes as before epochs existed.
func TestEpochsWrapAndEncode(t *testing.T) {
	t.Parallel()
	lim := Limit{Algorithm: FixedWindow, Limit: 5, WindowMS: 1000}
	now := int64(1_700_000_000_000_000_000)
	var st State
	Decide(&st, lim, 1, now)
	b, _ := st.MarshalBinary()
	if b[1] != byte(FixedWindow) {
		t.Fatalf("a state never reset encodes its algorithm byte as %#x", b[1])
	}
	for i := 1; i <= MaxEpoch+1; i++ {
		st = Reset(st, now)
		Decide(&st, lim, 1, now)
		if want := uint8(i % (MaxEpoch + 1)); st.Epoch != want {
			t.Fatalf("after %d resets the epoch is %d, want %d", i, st.Epoch, want)
		}
		if err := roundTrip(st); err != nil {
			t.Fatal(err)
		}
		b, _ := st.MarshalBinary()
		if b[1]&algorithmMask != byte(FixedWindow) || b[1]>>epochShift != st.Epoch {
			t.Fatalf("epoch %d encodes as %#x", st.Epoch, b[1])
		}
	}
}

// TestRefundKeepsTheEpoch: a quota lease given back after a reset counts in
// the reset's epoch.
func TestRefundKeepsTheEpoch(t *testing.T) {
	t.Parallel()
	for _, lim := range refundLimits() {
		t.Run(fmt.Sprint(lim), func(t *testing.T) {
			now := int64(1_700_000_000_000_000_000)
			var st State
			Decide(&st, lim, lim.Limit, now)
			st = Reset(st, now)
			Decide(&st, lim, 2, now+1)
			Refund(&st, &lim, 1, now+1, now+2)
			if st.Epoch != 1 {
				t.Fatalf("epoch %d after a refund, want 1", st.Epoch)
			}
		})
	}
}
