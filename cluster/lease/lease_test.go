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
	if n := tb.Revoke(nil); n != 1 || tb.Len() != 0 || tb.Stats().Unused != 4 {
		t.Fatalf("Revoke = %d, Len %d, stats %+v", n, tb.Len(), tb.Stats())
	}
}

// A ring change revokes the leases of the keys it moved, and keeps the
// others spendable.
func TestRevokeOnlyMovedKeys(t *testing.T) {
	t.Parallel()
	const ms = int64(time.Millisecond)
	tb := NewTable()
	moved := Key{Name: "n", Key: "moved", Limit: bucket.Limit{Limit: 100, WindowMS: 1000}}
	stayed := Key{Name: "n", Key: "stayed", Limit: moved.Limit}
	for _, k := range []Key{moved, stayed} {
		if !tb.Put(k, Grant{Tokens: 5, TTL: 100 * time.Millisecond}, 1, 0, 800, time.Second) {
			t.Fatal("valid grant refused")
		}
	}
	if n := tb.Revoke(func(k Key) bool { return k.Key == "moved" }); n != 1 || tb.Len() != 1 {
		t.Fatalf("Revoke(moved) = %d, Len %d; want 1, 1", n, tb.Len())
	}
	var d bucket.Decision
	if tb.Take(moved, 1, 10*ms, &d) {
		t.Error("spent a revoked lease")
	}
	if !tb.Take(stayed, 1, 10*ms, &d) || d.Remaining != 4 {
		t.Errorf("the lease of a key that did not move: %+v", d)
	}
	if st := tb.Stats(); st.Revoked != 1 || st.Unused != 5 {
		t.Errorf("stats %+v, want 1 revoked and 5 unused", st)
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
	returnedBy := map[bucket.Algorithm]int64{}
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
		var total, granted, refusedHere, returned int64
		// refusedAt[h]: when h's last refusal lease was granted; lastBack:
		// when the owner last took hits back.
		refusedAt, lastBack := make([]int64, holders), int64(0)
		quiet := false
		for step := range 20_000 {
			if r.IntN(500) == 0 {
				quiet = !quiet // the key cools down, or heats up again
			}
			if quiet {
				now += r.Int64N(80 * ms)
			} else {
				now += r.Int64N(3 * ms)
			}
			if r.IntN(2000) == 0 {
				tables[r.IntN(holders)] = NewTable() // a holder crashed, its returns with it
			}
			if r.IntN(3000) == 0 {
				for _, tb := range tables {
					tb.Revoke(nil) // membership changed, and moved the key
				}
				heat.ForgetGrants(nil)
			}
			if r.IntN(20) == 0 {
				// A holder's lease loop: leases that ended go back to the
				// owner, which takes back what it has a record of.
				h := r.IntN(holders)
				tables[h].Sweep(now)
				for _, rt := range tables[h].TakeReturns(nil) {
					if back := heat.Return(1, uint64(h), rt.GrantedAt, rt.Hits); back > 0 {
						if got := bucket.Refund(&st, &lim, back, rt.GrantedAt, now); got > 0 {
							returned += got
							lastBack = now
						}
					}
				}
			}
			hits := 1 + r.Int64N(2)
			h := r.IntN(holders + 1) // holders+1: a check at the owner itself
			var d bucket.Decision
			switch {
			case h < holders && tables[h].Take(k, hits, now, &d):
				if !d.Allowed() {
					// A refusal lease refuses only what the owner would —
					// unless the owner took hits back since it was
					// granted (docs/leases.md: a refusal may then refuse
					// for the rest of its life what the owner would now
					// admit).
					probe := st
					if lastBack < refusedAt[h] && bucket.Decide(&probe, lim, hits, now).Allowed() {
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
							refusedAt[h] = now
						}
					}
				} else if h < holders {
					if rate, grant, spent := heat.Observe(1, uint64(h), hits, now, 50, ttl/2, d.Allowed()); grant {
						if g := Size(rate, TTL(&lim, now, ttl), d.Remaining, spent); g > 0 {
							if bucket.Decide(&st, lim, g, now).Allowed() {
								heat.Granted(1, uint64(h), now, g)
								sent := now - r.Int64N(2*ms) // sent before the owner decided
								tables[h].Put(k, Grant{Tokens: g, TTL: TTL(&lim, now, ttl), GrantedAt: now}, hits, sent, 0, ttl)
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
		returnedBy[lim.Algorithm] += returned
	}
	for _, lim := range algs {
		if returnedBy[lim.Algorithm] == 0 {
			t.Errorf("%v: no hit was taken back in 20 seeds: the model tests no return", lim.Algorithm)
		}
		t.Logf("%v: %d hits taken back over 20 seeds", lim.Algorithm, returnedBy[lim.Algorithm])
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

// TestReturnsOfEndedLeases: a slice that ends with hits left — expired,
// swept, or pushed out by a newer one — is put up for return once, with
// its grant's id; a revoked one, or one whose grant carries no id, is not.
func TestReturnsOfEndedLeases(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	k := Key{Name: "n", Key: "k", Limit: bucket.Limit{Limit: 100, WindowMS: 1000}}
	ttl := 100 * time.Millisecond
	tb.Put(k, Grant{Tokens: 10, TTL: ttl, GrantedAt: 7}, 1, 0, 500, time.Second)
	var d bucket.Decision
	if !tb.Take(k, 4, 50*ms, &d) {
		t.Fatal("no decision from the lease")
	}
	if got := tb.TakeReturns(nil); len(got) != 0 {
		t.Fatalf("returns before the lease ended: %+v", got)
	}
	tb.Sweep(100 * ms)
	got := tb.TakeReturns(nil)
	if len(got) != 1 || got[0] != (Return{Key: k, Hits: 6, GrantedAt: 7}) {
		t.Fatalf("returns after the end: %+v, want 6 hits of the grant at 7", got)
	}
	if again := tb.TakeReturns(nil); len(again) != 0 {
		t.Fatalf("returned twice: %+v", again)
	}
	// Pushed out by a fifth slice.
	for i := range MaxSlices + 1 {
		tb.Put(k, Grant{Tokens: 3, TTL: ttl + time.Duration(i)*time.Millisecond, GrantedAt: int64(100 + i)}, 1, 200*ms, 500, time.Second)
	}
	if got := tb.TakeReturns(nil); len(got) != 1 || got[0].GrantedAt != 100 || got[0].Hits != 3 {
		t.Fatalf("the slice pushed out: %+v, want 3 hits of the grant at 100", got)
	}
	tb.Revoke(nil)
	if got := tb.TakeReturns(nil); len(got) != 0 {
		t.Fatalf("revoked leases returned: %+v", got)
	}
	// A grant without an id is not returned.
	tb.Put(k, Grant{Tokens: 5, TTL: ttl}, 1, 400*ms, 500, time.Second)
	tb.Sweep(600 * ms)
	if got := tb.TakeReturns(nil); len(got) != 0 {
		t.Fatalf("a grant without an id returned: %+v", got)
	}
	if st := tb.Stats(); st.Returning != 9 || st.Unused != 6+3+4*3+5 {
		t.Fatalf("stats %+v: want 9 hits put up for return of %d unused", st, 6+3+4*3+5)
	}
}

// TestHeatTakesBackOnlyWhatItGranted: a return is taken back up to what
// is left of the grant it names, once; a grant it has no record of (an
// unknown id, another sender, forgotten on a ring change) gives nothing.
func TestHeatTakesBackOnlyWhatItGranted(t *testing.T) {
	t.Parallel()
	h := NewHeat(1024, 100*time.Millisecond)
	gap := 50 * time.Millisecond
	now := int64(1_000_000) * ms
	if _, grant, _ := h.Observe(9, 1, 500, now, 100, gap, true); !grant {
		t.Fatal("no grant")
	}
	h.Granted(9, 1, now, 40)
	if got := h.Return(9, 1, now+1, 10); got != 0 {
		t.Errorf("unknown grant id: took back %d", got)
	}
	if got := h.Return(9, 2, now, 10); got != 0 {
		t.Errorf("another sender: took back %d", got)
	}
	if got := h.Return(9, 1, now, 30); got != 30 {
		t.Errorf("took back %d of 30", got)
	}
	if got := h.Return(9, 1, now, 30); got != 10 {
		t.Errorf("second return: took back %d, want the 10 left", got)
	}
	if got := h.Return(9, 1, now, 1); got != 0 {
		t.Errorf("third return: took back %d of a spent grant", got)
	}
	if _, grant, _ := h.Observe(9, 1, 500, now+60*ms, 100, gap, true); !grant {
		t.Fatal("no second grant")
	}
	h.Granted(9, 1, now+60*ms, 20)
	// Grants of 500 more keys, over every stripe.
	for k := uint64(100); k < 600; k++ {
		if _, grant, _ := h.Observe(k, 1, 500, now, 100, gap, true); grant {
			h.Granted(k, 1, now, 3)
		}
	}
	// Which grants are still recorded (a key can lose its slot to
	// another): each of those gives back 1 of its 3.
	recorded := map[uint64]bool{}
	for k := uint64(100); k < 600; k++ {
		recorded[k] = h.Return(k, 1, now, 1) == 1
	}
	// A ring change that moved the odd keys forgets their grants only.
	odd := func(k uint64) bool { return k%2 == 1 }
	h.ForgetGrants(odd)
	if got := h.Return(9, 1, now+60*ms, 5); got != 0 {
		t.Errorf("key 9 moved: took back %d", got)
	}
	kept := 0
	for k := uint64(100); k < 600; k++ {
		want := int64(0)
		if recorded[k] && !odd(k) {
			want = 1
			kept++
		}
		if got := h.Return(k, 1, now, 1); got != want {
			t.Fatalf("key %d after ForgetGrants(odd): took back %d, want %d", k, got, want)
		}
	}
	if kept < 100 {
		t.Fatalf("only %d of 250 even keys' grants recorded: the test checks too little", kept)
	}
	h.ForgetGrants(nil)
	for k := uint64(100); k < 600; k += 2 {
		if got := h.Return(k, 1, now, 1); got != 0 {
			t.Fatalf("key %d after ForgetGrants(nil): took back %d", k, got)
		}
	}
}

// TestBookTakesBackEachGrantOnce: a Book takes back at most what is left
// of the grant a return names, for the receiver it was made to, until the
// grant is swept or forgotten.
func TestBookTakesBackEachGrantOnce(t *testing.T) {
	t.Parallel()
	b := NewBook()
	for at := int64(1); at <= 10; at++ { // more grants of one key than Heat keeps
		b.Record(7, 1, at, 10)
	}
	if got := b.Return(7, 1, 1, 4); got != 4 {
		t.Errorf("the oldest of ten grants: took back %d of 4", got)
	}
	if got := b.Return(7, 1, 1, 9); got != 6 {
		t.Errorf("again: took back %d, want the 6 left", got)
	}
	if got := b.Return(7, 1, 1, 1); got != 0 {
		t.Errorf("a spent grant: took back %d", got)
	}
	if got := b.Return(7, 2, 2, 1); got != 0 {
		t.Errorf("another receiver: took back %d", got)
	}
	if left := b.Sweep(6); left != 5 {
		t.Errorf("after sweeping grants before 6: %d left, want 5", left)
	}
	if got := b.Return(7, 1, 5, 1); got != 0 {
		t.Errorf("a swept grant: took back %d", got)
	}
	b.Record(8, 1, 9, 10)
	b.Forget(func(k uint64) bool { return k == 7 }) // key 7 moved
	if got := b.Return(7, 1, 9, 1); got != 0 {
		t.Errorf("key 7 moved: took back %d", got)
	}
	if got := b.Return(8, 1, 9, 1); got != 1 {
		t.Errorf("key 8 did not move: took back %d of 1", got)
	}
	b.Forget(nil)
	if got := b.Return(8, 1, 9, 1); got != 0 {
		t.Errorf("after Forget(nil): took back %d", got)
	}
}
