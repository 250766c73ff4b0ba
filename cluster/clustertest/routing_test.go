package clustertest

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// One batch through one member: items of keys the three members own are
// each decided by its owner, and invalid items get their own error without
// affecting the others.
func TestBatchMixesLocalRemoteAndInvalid(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2", "n3")
		var reqs []check.Request
		for k := range 30 {
			reqs = append(reqs, Request(fmt.Sprint("user:", k), 5, 1))
		}
		reqs = append(reqs, check.Request{Name: "", Key: "x", Hits: 1, Limit: bucket.Limit{Limit: 1, WindowMS: 1000}})
		reqs = append(reqs, check.Request{Name: LimitName, Key: "no-limit", Hits: 1})
		out := make([]check.Outcome, len(reqs))
		ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
		defer cancel()
		c.Member("n2").Node.Check(ctx, reqs, out)
		owners := map[string]bool{}
		for i := range 30 {
			if out[i].Err != "" || !out[i].Allowed() || out[i].Decision.Remaining != 4 {
				t.Fatalf("item %d: %+v", i, out[i])
			}
			owners[out[i].Owner] = true
		}
		if len(owners) != 3 {
			t.Errorf("30 keys decided by %d owners, want 3", len(owners))
		}
		if out[30].Err == "" || out[30].Decision.Status != bucket.StatusUnspecified {
			t.Errorf("empty name answered %+v", out[30])
		}
		if out[31].Err == "" {
			t.Errorf("no limit and no rule answered %+v", out[31])
		}
	})
}

// A member that receives a forward for a key it sees owned by another
// answers where the key lives and never forwards it itself; as a stand-in
// for an owner that did not answer, it decides.
func TestForwardedIsNeverForwardedAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := Formed(t, Options{}, "n1", "n2")
		key := OwnedBy(c, "n1", "n2", "user:", 1)[0]
		n1 := c.Member("n1").Node
		before := c.Peers.Calls()
		out, moved := make([]check.Outcome, 1), make([]string, 1)
		n1.CheckForwarded(context.Background(), "n2", []check.Request{Request(key, 3, 1)}, out, moved)
		if want := c.Member("n2").PeerAddr; moved[0] != want || out[0].Decision.Status != bucket.StatusUnspecified {
			t.Fatalf("forwarded check for another owner's key answered %+v moved to %q, want moved to %s", out[0], moved[0], want)
		}
		n1.CheckStandIn(context.Background(), "n2", []check.Request{Request(key, 3, 1)}, nil, out, moved)
		if out[0].Owner != "n1" || !out[0].Allowed() || moved[0] != "" {
			t.Fatalf("stand-in check answered %+v moved to %q", out[0], moved[0])
		}
		if got := c.Peers.Calls(); got != before {
			t.Errorf("%d peer calls: a forwarded check was forwarded again", got-before)
		}
	})
}
