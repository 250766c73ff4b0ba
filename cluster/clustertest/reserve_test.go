package clustertest

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// tokens is an LLM-style limit: 1,000 tokens a day in a token bucket,
// which refills less than one token in the seconds a test runs.
var tokens = bucket.Limit{Algorithm: bucket.TokenBucket, Limit: 1000, WindowMS: 24 * 3600 * 1000}

func tokenReq(key string, hits int64) check.Request {
	return check.Request{Name: LimitName, Key: key, Hits: hits, Limit: tokens}
}

func settleReq(key, id string, actual int64) check.Request {
	return check.Request{Name: LimitName, Key: key, Limit: tokens, ReservationID: id, Actual: actual}
}

// Reserve 1,000 tokens, settle at 250: 750 come back, through whichever
// nodes the calls arrive at; a second settle, a forged id and a settle
// past the TTL are refused and change nothing; a settle above the
// estimate charges the excess.
func TestReserveThenSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(Formed(t, Options{}, "n1", "n2", "n3"))
		c := r.C
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		key := OwnedBy(c, "n1", "n1", "llm", 1)[0]
		rq := tokenReq(key, 1000)
		rq.ReserveTTLMS = 60_000
		o := checkVia(t, c, "n2", rq)
		if !o.Allowed() || o.Remaining != 0 || o.Reservation == "" || o.Owner != "n1" {
			t.Fatalf("reserve 1000: %+v", o)
		}
		if got := checkVia(t, c, "n3", tokenReq(key, 1)); got.Allowed() {
			t.Fatalf("a token after the reservation took all: %+v", got)
		}
		s := checkVia(t, c, "n3", settleReq(key, o.Reservation, 250))
		if s.Err != "" || s.Returned != 750 || s.Remaining != 750 {
			t.Fatalf("settle at 250: %+v, want 750 returned and remaining", s)
		}
		if again := checkVia(t, c, "n2", settleReq(key, o.Reservation, 0)); !strings.Contains(again.Err, "settled already") {
			t.Fatalf("a second settle: %+v", again)
		}
		forged := []byte(o.Reservation)
		forged[len(forged)-3] ^= 1
		if f := checkVia(t, c, "n2", settleReq(key, string(forged), 0)); !strings.Contains(f.Err, "not one this key's owner made") {
			t.Fatalf("a forged id: %+v", f)
		}
		other := settleReq(key, o.Reservation, 0)
		other.Limit.Limit = 2000 // another limit than the reserving check's
		if f := checkVia(t, c, "n2", other); !strings.Contains(f.Err, "not one this key's owner made") {
			t.Fatalf("a settle under another limit: %+v", f)
		}
		if got := checkVia(t, c, "n1", tokenReq(key, 0)); got.Remaining != 750 {
			t.Fatalf("after the refused settles: %+v, want 750 remaining", got)
		}

		// Above the estimate: the excess is charged.
		rq = tokenReq(key, 100)
		rq.ReserveTTLMS = 60_000
		o = checkVia(t, c, "n3", rq)
		s = checkVia(t, c, "n2", settleReq(key, o.Reservation, 300))
		if s.Err != "" || s.Charged != 200 || s.Remaining != 450 {
			t.Fatalf("settle at 300 of 100: %+v, want 200 charged and 450 remaining", s)
		}
		// Past its TTL: counts at its estimate.
		rq = tokenReq(key, 50)
		rq.ReserveTTLMS = 1000
		o = checkVia(t, c, "n3", rq)
		time.Sleep(1500 * time.Millisecond)
		if late := checkVia(t, c, "n2", settleReq(key, o.Reservation, 0)); !strings.Contains(late.Err, "reserve_ttl_ms has passed") {
			t.Fatalf("a late settle: %+v", late)
		}
		if got := checkVia(t, c, "n1", tokenReq(key, 0)); got.Remaining != 400 {
			t.Fatalf("after the late settle: %+v, want 400 remaining", got)
		}
		// Algorithms whose state cannot give back are refused.
		bad := tokenReq(key, 1)
		bad.Limit = bucket.Limit{Algorithm: bucket.GCRA, Limit: 10, WindowMS: 1000}
		bad.ReserveTTLMS = 1000
		if b := checkVia(t, c, "n2", bad); !strings.Contains(b.Err, "token_bucket, fixed_window or sliding_window") {
			t.Fatalf("reserve on gcra: %+v", b)
		}
	})
}

// The owner that made a reservation crashes: its replica decides the key
// from the replicated count, and refuses the settle it cannot verify, so
// the reservation counts at its estimate and no quota comes back that was
// not reserved.
func TestSettleAfterTheOwnerCrashed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(Formed(t, Options{}, "n1", "n2", "n3"))
		c := r.C
		if err := r.pastMoveWindow(); err != nil {
			t.Fatal(err)
		}
		key := OwnedBy(c, "n1", "n1", "llm", 1)[0]
		rq := tokenReq(key, 600)
		rq.ReserveTTLMS = 60_000
		o := checkVia(t, c, "n2", rq)
		if !o.Allowed() || o.Reservation == "" {
			t.Fatalf("reserve: %+v", o)
		}
		crashReplicated(t, c, "n1")
		s := checkVia(t, c, "n2", settleReq(key, o.Reservation, 100))
		if !strings.Contains(s.Err, "not one this key's owner made") {
			t.Fatalf("settle at the new owner: %+v", s)
		}
		if got := checkVia(t, c, "n3", tokenReq(key, 0)); got.Remaining != 400 {
			t.Fatalf("after the refused settle: %+v, want the reservation counted at its estimate (400 remaining)", got)
		}
	})
}
