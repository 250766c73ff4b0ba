package clustertest

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// A key reset from a node that does not own it has its full quota again at
// its owner; the reset reaches the replica, so that after the owner
// crashes the replica admits exactly what is left after the hits counted
// since the reset, not the forgotten count (which a merge of copies would
// have kept); and a client's check cannot ask a reset. With several limits
// on the key, every one is reset.
func TestResetReachesTheReplicas(t *testing.T) {
	for _, multi := range []bool{false, true} {
		name := "one limit"
		if multi {
			name = "two limits"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := NewRunner(Formed(t, Options{}, "n1", "n2", "n3"))
				c := r.C
				if err := r.pastMoveWindow(); err != nil {
					t.Fatal(err)
				}
				const limit, after = 10, 3
				req := func(k string, hits int64) check.Request {
					q := Request(k, limit, hits)
					if multi {
						q.More = []bucket.Limit{q.Limit, {Algorithm: bucket.TokenBucket, Limit: limit, WindowMS: 60_000}}
						q.Limit = bucket.Limit{}
					}
					return q
				}
				keys := OwnedBy(c, "n1", "n1", "r", 4)
				for _, k := range keys {
					if o := checkVia(t, c, "n2", req(k, limit)); !o.Allowed() || o.Owner != "n1" {
						t.Fatalf("%s: the whole quota: %+v", k, o)
					}
					if o := checkVia(t, c, "n3", req(k, 1)); o.Allowed() {
						t.Fatalf("%s: admitted past the limit before the reset: %+v", k, o)
					}
					// A client cannot ask it.
					rq := req(k, 0)
					rq.Reset = true
					if o := checkVia(t, c, "n2", rq); o.Err == "" || !strings.Contains(o.Err, "ResetKey") {
						t.Fatalf("%s: a client's check with Reset: %+v", k, o)
					}
					ks, err := c.Member("n2").Node.ResetKey(context.Background(), req(k, 0))
					if err != nil || ks.Peek.Owner != "n1" || ks.Peek.Remaining != limit || !ks.Peek.Allowed() {
						t.Fatalf("%s: reset via n2: %+v, %v", k, ks, err)
					}
					if o := checkVia(t, c, "n3", req(k, after)); !o.Allowed() || o.Remaining != limit-after {
						t.Fatalf("%s: %d hits after the reset: %+v", k, after, o)
					}
				}
				crashReplicated(t, c, "n1")
				// The keys n1 owned: their new owner decides from the
				// replicated reset and the hits since.
				for _, k := range keys {
					got := 0
					for range limit {
						if o := checkVia(t, c, "n2", req(k, 1)); o.Err != "" {
							t.Fatalf("%s: %+v", k, o)
						} else if o.Allowed() {
							got++
						}
					}
					if got != limit-after {
						t.Fatalf("%s: %d admitted after the owner's crash, want %d (%d of %d counted since the reset)", k, got, limit-after, after, limit)
					}
				}
			})
		})
	}
}
