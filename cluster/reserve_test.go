package cluster

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// A node verifies exactly the reservation ids it made for the same key and
// limit, once, within their TTL.
func TestReservationIDs(t *testing.T) {
	t.Parallel()
	rs, other := newReservations(), newReservations()
	lim := bucket.Limit{Algorithm: bucket.TokenBucket, Limit: 1000, WindowMS: 60_000}
	now := t0.UnixNano()
	id := rs.mint("llm", "u1", &lim, 1000, 5000, now)
	for _, c := range []struct {
		name, key string
		lim       bucket.Limit
		rs        *reservations
		at        int64
		want      error
	}{
		{"llm", "u1", lim, other, now, errNotAReservation},
		{"llm", "u2", lim, rs, now, errNotAReservation},
		{"llm2", "u1", lim, rs, now, errNotAReservation},
		{"llm", "u1", bucket.Limit{Algorithm: bucket.TokenBucket, Limit: 999, WindowMS: 60_000}, rs, now, errNotAReservation},
		{"llm", "u1", lim, rs, now + 5001e6, errSettleExpired},
	} {
		if _, err := c.rs.claim(c.name, c.key, &c.lim, id, c.at); err != c.want {
			t.Errorf("%s/%s %v: %v, want %v", c.name, c.key, c.lim, err, c.want)
		}
	}
	res, err := rs.claim("llm", "u1", &lim, id, now+1)
	if err != nil || res.estimate != 1000 || res.grantedAt != now {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	if _, err := rs.claim("llm", "u1", &lim, id, now+2); err != errSettledAlready {
		t.Fatalf("second claim: %v", err)
	}
	rs.release(id)
	if _, err := rs.claim("llm", "u1", &lim, id, now+3); err != nil {
		t.Fatalf("claim after a release: %v", err)
	}
}

// Whatever the id, claim refuses what this node did not mint, and never
// panics.
func FuzzReservationID(f *testing.F) {
	rs := newReservations()
	lim := bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 10, WindowMS: 1000}
	f.Add(rs.mint("a", "b", &lim, 5, 1000, 1))
	f.Add("")
	f.Add("AQ")
	f.Add(strings.Repeat("A", 55))
	f.Fuzz(func(t *testing.T, id string) {
		minted := map[string]bool{rs.mint("a", "b", &lim, 5, 1000, 1): true}
		_, err := rs.claim("a", "b", &lim, id, 2)
		if err == nil && !minted[id] {
			t.Fatalf("claimed %q, which this node never minted", id)
		}
		rs.release(id)
	})
}
