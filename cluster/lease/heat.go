package lease

import (
	"iter"
	"sync"
	"time"
)

// Heat measures, on a key's owner, how fast each other node sends it the
// key's hits, over ticks of a fixed length, in a fixed number of slots: a
// key that loses its slot to a hotter one is simply forgotten, so the
// memory is bounded whatever the number of keys. Safe for concurrent use.
type Heat struct {
	tick  int64 // ns
	mask  uint64
	slots []heatSlot
	mu    [heatStripes]sync.Mutex
}

const heatStripes = 64

type heatSlot struct {
	key, from uint64
	start     int64   // the tick cur counts in (Unix ns)
	cur, prev int64   // hits in that tick and in the one before it
	granted   int64   // Unix ns of the last grant to from for key; 0 none
	size      int64   // hits in that grant
	rate      float64 // the rate it was granted at
	// The last grants to from for key, for returns (Return): when each
	// was made (Unix ns on the owner's clock, the grant's id) and how
	// many of its hits may still come back.
	grants [MaxSlices]grantRec
}

type grantRec struct{ at, left int64 }

// NewHeat returns a Heat of at least slots slots (rounded up to a power of
// two, at least 64) over ticks of tick.
func NewHeat(slots int, tick time.Duration) *Heat {
	n := 64
	for n < slots {
		n <<= 1
	}
	return &Heat{tick: max(int64(tick), 1), mask: uint64(n - 1), slots: make([]heatSlot, n)}
}

// mix spreads a (key, sender) pair over the slots.
func mix(key, from uint64) uint64 {
	x := key ^ (from * 0x9e3779b97f4a7c15)
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>32
}

// Observe counts hits of key from the node whose name hashes to from, at
// now, and reports whether a lease may be granted to it: the check was
// eligible (admitted, of a leasable limit), the sender's rate (hits per
// second, the more of the current and the last tick, admitted or not) is
// at least threshold and it got no grant for key within gap. When grant is
// true the grant is recorded as made at now (Granted records its size),
// and spent is the size of the sender's previous lease of key when that
// was granted within 2 × gap — a lease's lifetime — so that the sender
// spent it early: the owner sees only the checks a lease did not cover, so
// the rate alone understates a holder's demand. rate is returned either
// way.
func (h *Heat) Observe(key, from uint64, hits, now int64, threshold float64, gap time.Duration, eligible bool) (rate float64, grant bool, spent int64) {
	x := mix(key, from)
	i := x & h.mask
	j := i ^ 1                      // the other candidate slot
	mu := &h.mu[(i>>1)%heatStripes] // one lock for both

	start := now - now%h.tick
	mu.Lock()
	defer mu.Unlock()
	s := &h.slots[i]
	switch o := &h.slots[j]; {
	case s.key == key && s.from == from && s.start != 0:
	case o.key == key && o.from == from && o.start != 0:
		s = o
	default:
		// Take the colder of the two.
		if h.warmth(o, start) < h.warmth(s, start) {
			s = o
		}
		*s = heatSlot{key: key, from: from, start: start}
	}
	switch {
	case s.start == start:
	case s.start == start-h.tick:
		s.prev, s.cur, s.start = s.cur, 0, start
	case s.start < start:
		s.prev, s.cur, s.start = 0, 0, start
	}
	s.cur += hits
	rate = float64(max(s.cur, s.prev)) * float64(time.Second) / float64(h.tick)
	if s.granted != 0 && now >= s.granted && now-s.granted < 4*int64(gap) {
		// A sender that held a lease in the last two lifetimes sent the
		// owner only what its leases did not cover (a refusal lease may
		// have covered all of it): its rate is at least the one it was
		// granted at.
		rate = max(rate, s.rate)
	}
	if eligible && rate >= threshold && (s.granted == 0 || now-s.granted >= int64(gap) || now < s.granted) {
		if s.granted != 0 && now >= s.granted && now-s.granted < 2*int64(gap) {
			spent = s.size
		}
		s.granted, s.size, s.rate = now, 0, rate
		grant = true
	}
	return rate, grant, spent
}

// Granted records the size of the lease Observe just allowed for (key,
// from) at now; a slot another pair took meanwhile is left alone.
func (h *Heat) Granted(key, from uint64, now, size int64) {
	for s := range h.pair(key, from) {
		if s.granted == now {
			s.size = size
			// Replace the oldest record: a holder keeps at most
			// MaxSlices leases of a key.
			o := 0
			for k := range s.grants {
				if s.grants[k].at < s.grants[o].at {
					o = k
				}
			}
			s.grants[o] = grantRec{at: now, left: size}
		}
	}
}

// Return accepts back up to hits of the lease granted at (the grant's id,
// LeaseGrant.granted_at) to the node whose name hashes to from for key,
// and returns how many: no more than what is left of that grant, and none
// for a grant this Heat has no record of (granted before ForgetGrants, by
// another process, or forgotten when its slot went to a hotter key). So a
// grant's hits come back at most once, and only to the node that admitted
// them.
func (h *Heat) Return(key, from uint64, at, hits int64) int64 {
	if hits <= 0 || at == 0 {
		return 0
	}
	for s := range h.pair(key, from) {
		for k := range s.grants {
			if g := &s.grants[k]; g.at == at && g.left > 0 {
				back := min(hits, g.left)
				g.left -= back
				return back
			}
		}
	}
	return 0
}

// ForgetGrants drops the grant records of the keys moved reports (every
// key's when moved is nil), so that none of their leases granted before
// is taken back: the node's ring moved those keys, and their counters may
// come from another node that never counted the grants. moved is called
// with a stripe's lock held and must not call back into h.
func (h *Heat) ForgetGrants(moved func(key uint64) bool) {
	for st := range h.mu {
		h.mu[st].Lock()
		// The pairs of slots (2p, 2p+1) this stripe guards: p ≡ st.
		for p := st; 2*p+1 < len(h.slots); p += heatStripes {
			for i := 2 * p; i < 2*p+2; i++ {
				if s := &h.slots[i]; s.grants != ([MaxSlices]grantRec{}) && (moved == nil || moved(s.key)) {
					s.grants = [MaxSlices]grantRec{}
				}
			}
		}
		h.mu[st].Unlock()
	}
}

// pair yields the slots that hold (key, from) — of its two candidates —
// with their stripe locked.
func (h *Heat) pair(key, from uint64) iter.Seq[*heatSlot] {
	return func(yield func(*heatSlot) bool) {
		i := mix(key, from) & h.mask
		mu := &h.mu[(i>>1)%heatStripes]
		mu.Lock()
		defer mu.Unlock()
		for _, j := range [2]uint64{i, i ^ 1} {
			if s := &h.slots[j]; s.key == key && s.from == from && !yield(s) {
				return
			}
		}
	}
}

// warmth is what a slot counted in the tick at start and the one before.
func (h *Heat) warmth(s *heatSlot, start int64) int64 {
	switch s.start {
	case start:
		return s.cur + s.prev
	case start - h.tick:
		return s.cur
	}
	return 0
}
