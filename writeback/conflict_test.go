package writeback

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// A check whose limit counts a key by another algorithm than the key's
// live state is refused with an error naming both, and changes nothing:
// deciding it would start the count afresh and silently forget the hits
// the state holds. Once that state has expired the other algorithm counts
// the key, as a fresh one.
func TestAlgorithmConflictIsRefusedNotReset(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 16})
	k := Key{Name: "api", Key: "u1"}
	sw := bucket.Limit{Limit: 10, WindowMS: 1000, Algorithm: bucket.SlidingWindow}
	tb := bucket.Limit{Limit: 10, WindowMS: 1000, Algorithm: bucket.TokenBucket}
	for i := range 10 {
		if d, err := c.Decide(hashKey(k), k, sw, 1, base+int64(i)); err != nil || !d.Allowed() {
			t.Fatalf("hit %d: %+v %v", i, d, err)
		}
	}
	get := func(now int64) Record {
		t.Helper()
		rec, ok, err := c.Get(hashKey(k), k, now)
		if err != nil || !ok {
			t.Fatalf("get: ok=%v err=%v", ok, err)
		}
		return rec
	}
	before := get(base + 20)
	for _, hits := range []int64{1, 0} { // a check and a peek
		_, err := c.Decide(hashKey(k), k, tb, hits, base+20)
		var ce *bucket.AlgorithmConflict
		if !errors.As(err, &ce) || ce.Stored != bucket.SlidingWindow || ce.Asked != bucket.TokenBucket {
			t.Fatalf("hits %d under token_bucket: err %v, want an AlgorithmConflict (sliding_window, token_bucket)", hits, err)
		}
		t.Logf("refused: %v", err)
		if after := get(base + 20); after != before {
			t.Fatalf("the refused check changed the state: %+v, was %+v", after, before)
		}
	}
	// The sliding window still counts the key: it is full.
	if d, err := c.Decide(hashKey(k), k, sw, 1, base+30); err != nil || d.Allowed() {
		t.Fatalf("sliding window after the refusals: %+v %v, want refused as over the limit", d, err)
	}
	// Past its expiry the state is as good as fresh: token_bucket takes it.
	exp := before.State.Expires
	if d, err := c.Decide(hashKey(k), k, tb, 1, exp+int64(time.Millisecond)); err != nil || !d.Allowed() || d.Remaining != 9 {
		t.Fatalf("token bucket after the state expired: %+v %v", d, err)
	}
}

// The same conflict among the limits of a multi-limit check: limit i of a
// key keeps its own state, so changing the algorithm of limit 1 only is
// refused too.
func TestAlgorithmConflictInDecideAll(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 16})
	k := Key{Name: "api", Key: "u2"}
	a := bucket.Limit{Limit: 100, WindowMS: 60_000, Algorithm: bucket.FixedWindow}
	b := bucket.Limit{Limit: 10, WindowMS: 1000, Algorithm: bucket.SlidingWindow}
	if d, err := c.DecideAll(hashKey(k), k, []bucket.Limit{a, b}, 3, base, 1); err != nil || !d.Allowed() {
		t.Fatalf("first: %+v %v", d, err)
	}
	b2 := b
	b2.Algorithm = bucket.GCRA
	_, err := c.DecideAll(hashKey(k), k, []bucket.Limit{a, b2}, 1, base+1, 1)
	var ce *bucket.AlgorithmConflict
	if !errors.As(err, &ce) || ce.Stored != bucket.SlidingWindow || ce.Asked != bucket.GCRA {
		t.Fatalf("err %v, want an AlgorithmConflict (sliding_window, gcra)", err)
	}
	// Nothing was consumed by the refused call: limit 0 still has 97.
	if d, err := c.DecideAll(hashKey(k), k, []bucket.Limit{a, b}, 0, base+2, 1); err != nil || d.Remaining != 7 {
		t.Fatalf("peek after the refusal: %+v %v (want remaining 7 of limit 10 after 3 hits)", d, err)
	}
}
