package bucket

import (
	"math/rand/v2"
	"testing"
)

// Against a model (a map of lease → expiry), random acquires, renews and
// releases at random times: never more than limit live leases, every
// answer as the model's, and the state survives encoding.
func TestHoldersAgainstModel(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 9))
		limit := 1 + rng.Int64N(8)
		ttl := 1 + rng.Int64N(2000)
		var s State
		model := map[int64]int64{}
		now, next := int64(1_700_000_000_000_000_000), int64(0)
		liveN := func() int64 {
			n := int64(0)
			for _, exp := range model {
				if exp > now {
					n++
				}
			}
			return n
		}
		for range 2000 {
			now += rng.Int64N(ttl * nsPerMS / 4)
			switch rng.IntN(3) {
			case 0:
				next++
				d := Acquire(&s, limit, ttl, next, now)
				want := liveN() < limit
				if d.Allowed() != want {
					t.Fatalf("seed %d: acquire with %d live of %d: %+v", seed, liveN(), limit, d)
				}
				if want {
					model[next] = now + ttl*nsPerMS
					if d.ResetAfterMS != ttl {
						t.Fatalf("seed %d: lease for %d ms, want %d", seed, d.ResetAfterMS, ttl)
					}
				} else if d.RetryAfterMS <= 0 {
					t.Fatalf("seed %d: a refusal without a wait: %+v", seed, d)
				}
			case 1:
				id := 1 + rng.Int64N(next+1)
				_, ok := Renew(&s, limit, ttl, id, now)
				exp, held := model[id]
				if ok != (held && exp > now) {
					t.Fatalf("seed %d: renew %d: %v, model %v (expiry %d, now %d)", seed, id, ok, held, exp, now)
				}
				if ok {
					model[id] = max(exp, now+ttl*nsPerMS)
				}
			case 2:
				id := 1 + rng.Int64N(next+1)
				_, ok := Release(&s, limit, id, now)
				exp, held := model[id]
				if ok != (held && exp > now) {
					t.Fatalf("seed %d: release %d: %v, model %v", seed, id, ok, held)
				}
				delete(model, id)
			}
			if got := HoldersAt(&s, now); got != liveN() || got > limit {
				t.Fatalf("seed %d: %d holders, model %d, limit %d", seed, got, liveN(), limit)
			}
			if err := roundTrip(s); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// A state whose every lease expired is fresh; Merge has no rule for
// holders (the newer copy wins, so a release reaches the replicas).
func TestHoldersExpireAndDoNotMerge(t *testing.T) {
	t.Parallel()
	now := int64(1_700_000_000_000_000_000)
	var s State
	Acquire(&s, 2, 1000, 1, now)
	Acquire(&s, 2, 500, 2, now)
	if s.Fresh(now+999*nsPerMS) || !s.Fresh(now+1000*nsPerMS) {
		t.Fatalf("holders state %+v: fresh only once every lease expired", s)
	}
	older := s
	Release(&s, 2, 1, now+1)
	if _, ok := Merge(s, older); ok {
		t.Fatal("holders merged")
	}
	if d := Acquire(&s, 2, 1000, 3, now+2); !d.Allowed() || d.Remaining != 0 {
		t.Fatalf("after a release: %+v", d)
	}
	if d := Acquire(&s, 2, 1000, 4, now+3); d.Allowed() || d.RetryAfterMS != 500 {
		t.Fatalf("past the limit: %+v, want a wait of 500 ms for lease 2", d)
	}
}
