package cluster

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
)

// A check that asks another algorithm for a key than the one counting it
// gets an error naming both, on whichever node it arrives, and the count
// goes on: before, the owner started the key afresh under the new
// algorithm and admitted the limit again.
func TestAnotherAlgorithmIsRefusedAcrossTheCluster(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 3, nil)
	owner, _ := nodes[0].Ring().Owner(ring.Hash("api", "user:7"))
	var via *Node
	for _, n := range nodes {
		if n.Name() != owner.Name {
			via = n // a node that forwards to the owner
		}
	}
	sw := req("api", "user:7", 1, 5)
	for i := range 5 {
		if o := check1(via, sw); o.Err != "" || !o.Allowed() {
			t.Fatalf("hit %d: %+v", i, o)
		}
	}
	tb := sw
	tb.Limit.Algorithm = bucket.TokenBucket
	for _, n := range nodes {
		o := check1(n, tb)
		if o.Allowed() || !strings.Contains(o.Err, "counted by sliding_window") || !strings.Contains(o.Err, "asks token_bucket") {
			t.Fatalf("token_bucket via %s: %+v, want refused with an error naming both algorithms", n.Name(), o)
		}
	}
	if o := check1(via, sw); o.Err != "" || o.Allowed() {
		t.Fatalf("sliding_window after the refusals: %+v, want over the limit (5 of 5 admitted)", o)
	}
}
