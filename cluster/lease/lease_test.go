package lease

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

const ms = int64(time.Millisecond)

func TestLeasable(t *testing.T) {
	t.Parallel()
	base := bucket.Limit{Limit: 10, WindowMS: 1000}
	with := func(f func(*bucket.Limit)) *bucket.Limit { l := base; f(&l); return &l }
	cases := []struct {
		name string
		lim  *bucket.Limit
		hits int64
		want bool
	}{
		{"sliding window", &base, 1, true},
		{"sliding window, explicit", with(func(l *bucket.Limit) { l.Algorithm = bucket.SlidingWindow }), 3, true},
		{"peek", &base, 0, false},
		{"sub-windows", with(func(l *bucket.Limit) { l.SubWindows = 4 }), 1, false},
		{"token bucket", with(func(l *bucket.Limit) { l.Algorithm = bucket.TokenBucket }), 1, true},
		{"fixed window", with(func(l *bucket.Limit) { l.Algorithm = bucket.FixedWindow }), 1, true},
		{"calendar window", with(func(l *bucket.Limit) { l.Algorithm, l.Calendar = bucket.FixedWindow, bucket.CalendarDay }), 1, false},
		{"sliding log", with(func(l *bucket.Limit) { l.Algorithm = bucket.SlidingLog }), 1, false},
		{"gcra", with(func(l *bucket.Limit) { l.Algorithm = bucket.GCRA }), 1, false},
		{"leaky bucket", with(func(l *bucket.Limit) { l.Algorithm = bucket.LeakyBucket }), 1, false},
		{"soft mode", with(func(l *bucket.Limit) { l.Mode, l.SoftPercent = bucket.ModeSoft, 120 }), 1, false},
		{"counted refusals", with(func(l *bucket.Limit) { l.CountRefused = true }), 1, false},
		{"zero limit", with(func(l *bucket.Limit) { l.Limit = 0 }), 1, false},
	}
	for _, c := range cases {
		if got := Leasable(c.lim, c.hits); got != c.want {
			t.Errorf("%s: Leasable = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestTTLEndsAtTheWindow(t *testing.T) {
	t.Parallel()
	win := &bucket.Limit{Limit: 10, WindowMS: 1000, Algorithm: bucket.FixedWindow}
	tb := &bucket.Limit{Limit: 10, WindowMS: 1000, Algorithm: bucket.TokenBucket}
	max := 100 * time.Millisecond
	for _, c := range []struct {
		lim  *bucket.Limit
		now  int64
		want time.Duration
	}{
		{win, 5_000 * ms, max},                   // a whole window ahead
		{win, 5_950 * ms, 50 * time.Millisecond}, // the window ends first
		{win, 5_999*ms + ms/2, 0},                // under a millisecond left
		{tb, 5_999*ms + ms/2, max},               // no window
		{&bucket.Limit{Limit: 1, WindowMS: 1000}, 7_930 * ms, 70 * time.Millisecond}, // sliding window
	} {
		if got := TTL(c.lim, c.now, max); got != c.want {
			t.Errorf("TTL(%v at %d) = %v, want %v", c.lim.Algorithm, c.now, got, c.want)
		}
	}
}

func TestSize(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		rate      float64
		ttl       time.Duration
		remaining int64
		spent     int64
		want      int64
	}{
		{1000, 100 * time.Millisecond, 1000, 0, 100},     // a lifetime of traffic
		{1000, 100 * time.Millisecond, 120, 0, 60},       // at most half of what is left
		{1000, 100 * time.Millisecond, 1, 0, 0},          // nothing to share
		{0, 100 * time.Millisecond, 1000, 0, 0},          // no traffic
		{1e12, time.Second, 1 << 40, 0, MaxTokens},       // at most MaxTokens
		{5, 100 * time.Millisecond, 1000, 0, 1},          // rounded up
		{1000, 100 * time.Millisecond, 10_000, 300, 600}, // the last lease spent early: twice it
		{1000, 100 * time.Millisecond, 10_000, 30, 100},  // ... unless the rate asks more
	} {
		if got := Size(c.rate, c.ttl, c.remaining, c.spent); got != c.want {
			t.Errorf("Size(%v, %v, %d, %d) = %d, want %d", c.rate, c.ttl, c.remaining, c.spent, got, c.want)
		}
	}
}

func TestTableSpendsTheSliceThatEndsFirst(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	k := Key{Name: "n", Key: "k", Limit: bucket.Limit{Limit: 100, WindowMS: 1000}}
	max := time.Second
	var d bucket.Decision
	if tb.Take(k, 1, 0, &d) {
		t.Fatal("an empty table decided")
	}
	if !tb.Put(k, Grant{Tokens: 3, TTL: 200 * time.Millisecond}, 1, 0, 900, max) ||
		!tb.Put(k, Grant{Tokens: 5, TTL: 100 * time.Millisecond}, 1, 10*ms, 800, max) {
		t.Fatal("valid grants refused")
	}
	// The second ends at 110 ms, the first at 200 ms: the second is spent first.
	if !tb.Take(k, 5, 50*ms, &d) || d.Remaining != 3 || !d.Allowed() || d.Limit != 100 {
		t.Fatalf("take 5 at 50 ms: %+v", d)
	}
	if tb.Take(k, 4, 60*ms, &d) {
		t.Fatal("took 4 from slices of 3 and 0")
	}
	// At 150 ms the spent slice is gone and the other still has 3.
	if !tb.Take(k, 2, 150*ms, &d) || d.Remaining != 1 {
		t.Fatalf("take 2 at 150 ms: %+v", d)
	}
	if tb.Take(k, 1, 200*ms, &d) {
		t.Fatal("spent a slice at its end")
	}
	if tb.Len() != 0 {
		t.Fatalf("Len = %d after every slice ended", tb.Len())
	}
	st := tb.Stats()
	if st.Granted != 2 || st.Tokens != 8 || st.Decisions != 2 || st.Spent != 7 || st.Unused != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Another limit for the same key spends nothing of it.
	tb.Put(k, Grant{Tokens: 3, TTL: 100 * time.Millisecond}, 1, 300*ms, 0, max)
	other := k
	other.Limit.Limit = 99
	if tb.Take(other, 1, 310*ms, &d) {
		t.Fatal("a lease was spent under another limit")
	}
	if n := tb.Revoke(); n != 1 || tb.Len() != 0 || tb.Stats().Unused != 4 {
		t.Fatalf("Revoke = %d, Len %d, stats %+v", n, tb.Len(), tb.Stats())
	}
}

func TestTableRefusesInvalidGrants(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	k := Key{Name: "n", Key: "k"}
	for _, g := range []Grant{{Tokens: -1, TTL: time.Millisecond},
		{Tokens: MaxTokens + 1, TTL: time.Millisecond}, {Tokens: 1, TTL: 0}, {Tokens: 1, TTL: -time.Second},
		{Tokens: 1, TTL: 2 * time.Second}} {
		if tb.Put(k, g, 1, 0, 0, time.Second) {
			t.Errorf("Put(%+v) kept", g)
		}
	}
	if tb.Len() != 0 {
		t.Fatalf("Len = %d", tb.Len())
	}
}

func TestTableKeepsAtMostMaxSlices(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	k := Key{Name: "n", Key: "k"}
	for i := range MaxSlices + 2 {
		tb.Put(k, Grant{Tokens: 10, TTL: time.Duration(100+i) * time.Millisecond}, 1, 0, 0, time.Second)
	}
	var d bucket.Decision
	if !tb.Take(k, 1, 0, &d) || d.Remaining != MaxSlices*10-1 {
		t.Fatalf("Remaining %d, want %d", d.Remaining, MaxSlices*10-1)
	}
	if st := tb.Stats(); st.Unused != 20 {
		t.Fatalf("Unused %d, want the 2 dropped slices' 20", st.Unused)
	}
}

func TestHeatRateThresholdAndGap(t *testing.T) {
	t.Parallel()
	h := NewHeat(1024, 100*time.Millisecond)
	gap := 50 * time.Millisecond
	now := int64(1_000_000) * ms
	// 9 hits in a tick: 90/s, under a threshold of 100/s.
	for i := range 9 {
		if rate, grant, _ := h.Observe(1, 7, 1, now+int64(i)*ms, 100, gap, true); grant || rate != float64(i+1)*10 {
			t.Fatalf("hit %d: rate %v grant %v", i, rate, grant)
		}
	}
	rate, grant, _ := h.Observe(1, 7, 1, now+9*ms, 100, gap, true)
	if rate != 100 || !grant {
		t.Fatalf("10th hit: rate %v grant %v", rate, grant)
	}
	// Within the gap no second grant; the rate carries into the next tick.
	if _, grant, _ := h.Observe(1, 7, 1, now+20*ms, 100, gap, true); grant {
		t.Fatal("granted twice within the gap")
	}
	if rate, grant, _ := h.Observe(1, 7, 1, now+110*ms, 100, gap, true); !grant || rate != 110 {
		t.Fatalf("next tick: rate %v grant %v", rate, grant)
	}
	// Another sender of the same key is counted apart.
	if rate, _, _ := h.Observe(1, 8, 1, now+110*ms, 100, gap, true); rate != 10 {
		t.Fatalf("other sender's rate %v", rate)
	}
	// A refused check counts toward the rate but earns no grant.
	if rate, grant, _ := h.Observe(2, 7, 100, now+120*ms, 100, 0, false); grant || rate != 1000 {
		t.Fatalf("ineligible: rate %v grant %v", rate, grant)
	}
	if _, grant, _ := h.Observe(2, 7, 1, now+121*ms, 100, 0, true); !grant {
		t.Fatal("no grant for an eligible check after ineligible ones made the key hot")
	}
	// Two ticks later the key has cooled.
	if rate, grant, _ := h.Observe(1, 7, 1, now+400*ms, 100, gap, true); grant || rate != 10 {
		t.Fatalf("cooled: rate %v grant %v", rate, grant)
	}
}

func TestHeatForgetsColdKeysForHotOnes(t *testing.T) {
	t.Parallel()
	h := NewHeat(64, 100*time.Millisecond)
	now := int64(1_000_000) * ms
	// A hot key, then many cold ones: the hot one keeps being counted,
	// whatever slot the others take.
	for i := range 50 {
		h.Observe(42, 1, 1, now+int64(i)*ms, 1e9, 0, true)
	}
	for k := range uint64(10_000) {
		h.Observe(1000+k, 1, 1, now+60*ms, 1e9, 0, true)
	}
	if rate, _, _ := h.Observe(42, 1, 1, now+70*ms, 1e9, 0, true); rate < 510 {
		t.Fatalf("hot key's rate %v after 10,000 cold keys, want 510", rate)
	}
}

// TestModelLeasesNeverOverAdmit runs an owner deciding with the real
// algorithms, granting leases and refusal leases as cluster.Node does
// (Heat, TTL, Size), and holders spending them, at random times, with
// random crashes (a holder loses its table) and membership changes (every
// holder revokes), and checks the algorithm's own bound on every window: a
// fixed window admits at most limit in each window; the sliding-window
// counter at most limit in each aligned window; a token bucket at most
// burst + the refill since the start in any prefix. A holder's refusal
// from a refusal lease must be one the owner would make at that moment.
func TestModelLeasesNeverOverAdmit(t *testing.T) {
	t.Parallel()
	algs := []bucket.Limit{
		{Limit: 50, WindowMS: 1000, Algorithm: bucket.FixedWindow},
		{Limit: 50, WindowMS: 1000},
		{Limit: 50, WindowMS: 1000, Algorithm: bucket.TokenBucket},
	}
	for seed := range uint64(60) {
		lim := algs[seed%3]
		r := rand.New(rand.NewPCG(seed, 99))
		const holders, ttl = 3, 100 * time.Millisecond
		heat := NewHeat(256, 100*time.Millisecond)
		tables := make([]*Table, holders)
		for i := range tables {
			tables[i] = NewTable()
		}
		var st bucket.State
		k := Key{Name: "n", Key: "k", Limit: lim}
		now := int64(1_000_000)*ms + r.Int64N(1000)*ms
		start := now
		w := lim.WindowMS * ms
		admitted := map[int64]int64{} // aligned window start → hits admitted
		var total, granted, refusedHere int64
		for step := range 20_000 {
			now += r.Int64N(3 * ms)
			if r.IntN(2000) == 0 {
				tables[r.IntN(holders)] = NewTable() // a holder crashed
			}
			if r.IntN(3000) == 0 {
				for _, tb := range tables {
					tb.Revoke() // membership changed
				}
			}
			hits := 1 + r.Int64N(2)
			h := r.IntN(holders + 1) // holders+1: a check at the owner itself
			var d bucket.Decision
			switch {
			case h < holders && tables[h].Take(k, hits, now, &d):
				if !d.Allowed() {
					// A refusal lease refuses only what the owner would.
					probe := st
					if bucket.Decide(&probe, lim, hits, now).Allowed() {
						t.Fatalf("seed %d step %d (%v): a holder refused %d hits the owner would admit", seed, step, lim.Algorithm, hits)
					}
					refusedHere++
				}
			default:
				d = bucket.Decide(&st, lim, hits, now)
				if h < holders && d.Status == bucket.OverLimit {
					if _, grant, _ := heat.Observe(1, uint64(h), hits, now, 50, ttl/2, true); grant {
						if until := RefusalTTL(d.RetryAfterMS, TTL(&lim, now, ttl)); until > 0 {
							sent := now - r.Int64N(2*ms)
							tables[h].Put(k, Grant{TTL: until}, hits, sent, 0, ttl)
						}
					}
				} else if h < holders {
					if rate, grant, spent := heat.Observe(1, uint64(h), hits, now, 50, ttl/2, d.Allowed()); grant {
						if g := Size(rate, TTL(&lim, now, ttl), d.Remaining, spent); g > 0 {
							heat.Granted(1, uint64(h), now, g)
							if bucket.Decide(&st, lim, g, now).Allowed() {
								sent := now - r.Int64N(2*ms) // sent before the owner decided
								tables[h].Put(k, Grant{Tokens: g, TTL: TTL(&lim, now, ttl)}, hits, sent, 0, ttl)
								granted += g
							}
						}
					}
				}
			}
			if !d.Allowed() {
				continue
			}
			admitted[now-now%w] += hits
			total += hits
			if lim.Algorithm == bucket.TokenBucket {
				// burst (= limit) + refill of limit per W since the start.
				if bound := lim.Limit + (now-start)*lim.Limit/w; total > bound {
					t.Fatalf("seed %d step %d: token bucket admitted %d, bound %d", seed, step, total, bound)
				}
			}
		}
		if lim.Algorithm != bucket.TokenBucket {
			for ws, n := range admitted {
				if n > lim.Limit {
					t.Fatalf("seed %d (%v): window at %d admitted %d > limit %d", seed, lim.Algorithm, ws, n, lim.Limit)
				}
			}
		}
		if granted == 0 || refusedHere == 0 {
			t.Fatalf("seed %d: %d hits leased, %d checks refused from refusal leases: the model tests nothing", seed, granted, refusedHere)
		}
	}
}

func TestHeatReportsALeaseSpentEarly(t *testing.T) {
	t.Parallel()
	h := NewHeat(1024, 100*time.Millisecond)
	gap := 50 * time.Millisecond
	now := int64(1_000_000) * ms
	if _, grant, spent := h.Observe(9, 1, 100, now, 100, gap, true); !grant || spent != 0 {
		t.Fatalf("first grant %v, spent %d", grant, spent)
	}
	h.Granted(9, 1, now, 40)
	// Back for more 60 ms later, within a lease's lifetime (2 × gap): it
	// spent the 40 early.
	if _, grant, spent := h.Observe(9, 1, 1, now+60*ms, 100, gap, true); !grant || spent != 40 {
		t.Fatalf("renewal: grant %v, spent %d, want 40", grant, spent)
	}
	h.Granted(9, 1, now+60*ms, 80)
	// Back after the lease would have ended: its size says nothing.
	if _, grant, spent := h.Observe(9, 1, 100, now+300*ms, 100, gap, true); !grant || spent != 0 {
		t.Fatalf("after the lifetime: grant %v, spent %d, want 0", grant, spent)
	}
	// Granted for a grant that is not the slot's last changes nothing.
	h.Granted(9, 1, now, 7)
	if _, grant, spent := h.Observe(9, 1, 1, now+360*ms, 100, gap, true); !grant || spent != 0 {
		t.Fatalf("stale Granted: grant %v, spent %d, want 0 (the last grant's size was never recorded)", grant, spent)
	}
}

func TestRefusalLeases(t *testing.T) {
	t.Parallel()
	if got := RefusalTTL(30, 100*time.Millisecond); got != 29*time.Millisecond {
		t.Errorf("RefusalTTL(30 ms) = %v, want 29ms (the rounded-up retry, less a millisecond)", got)
	}
	if got := RefusalTTL(5_000, 40*time.Millisecond); got != 40*time.Millisecond {
		t.Errorf("RefusalTTL(5 s, lease 40 ms) = %v, want 40ms", got)
	}
	if got := RefusalTTL(1, time.Second); got != 0 {
		t.Errorf("RefusalTTL(1 ms) = %v, want 0", got)
	}
	tb := NewTable()
	k := Key{Name: "n", Key: "k", Limit: bucket.Limit{Limit: 10, WindowMS: 1000}}
	if !tb.Put(k, Grant{TTL: 50 * time.Millisecond}, 2, 0, 700, time.Second) {
		t.Fatal("a refusal lease was not kept")
	}
	var d bucket.Decision
	if tb.Take(k, 1, 10*ms, &d) {
		t.Fatalf("a refusal for 2 hits refused 1: %+v", d)
	}
	if !tb.Take(k, 3, 10*ms, &d) || d.Allowed() || d.RetryAfterMS != 40 || d.ResetAfterMS != 690 || d.Limit != 10 {
		t.Fatalf("3 hits at 10 ms: %+v, want refused, retry 40 ms, reset 690 ms", d)
	}
	if tb.Take(k, 2, 50*ms, &d) {
		t.Fatal("refused at the refusal lease's end")
	}
	// A slice that covers the check wins over a refusal.
	tb.Put(k, Grant{TTL: 50 * time.Millisecond}, 1, 100*ms, 0, time.Second)
	tb.Put(k, Grant{Tokens: 1, TTL: 50 * time.Millisecond}, 1, 100*ms, 0, time.Second)
	if !tb.Take(k, 1, 110*ms, &d) || !d.Allowed() {
		t.Fatalf("with a slice and a refusal: %+v, want allowed", d)
	}
	if !tb.Take(k, 1, 110*ms, &d) || d.Allowed() {
		t.Fatalf("slice spent, refusal live: %+v, want refused", d)
	}
	if st := tb.Stats(); st.Refusals != 2 || st.Refused != 2 {
		t.Fatalf("stats %+v", st)
	}
	tb.Sweep(200 * ms)
	if tb.Len() != 0 {
		t.Fatalf("Len %d after everything ended", tb.Len())
	}
}
