package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// A graceful leave hands on the counters of multi-limit checks too: the
// drain reads them back from the store, and before the limit index was
// typed their store keys decoded as other keys ("api" + "0\x00key"), so
// the next owner got them under the wrong keys and admitted the limit
// again.
func TestGracefulLeaveHandsMultiLimitCountersOn(t *testing.T) {
	t.Parallel()
	nodes, _ := memCluster(t, 3, nil)
	keys := keysOwnedBy(nodes[0], "n2", 20)
	multi := func(k string) check.Request {
		r := req("api", k, 1, 6)
		r.More = []bucket.Limit{{Limit: 100, WindowMS: 60_000}}
		return r
	}
	admitted := func(n *Node, k string, times int) int {
		got := 0
		for range times {
			o := check1(n, multi(k))
			if o.Err != "" {
				t.Fatalf("key %s via %s: %s", k, n.Name(), o.Err)
			}
			if o.Allowed() {
				got++
			}
		}
		return got
	}
	for _, k := range keys {
		if got := admitted(nodes[0], k, 6); got != 6 {
			t.Fatalf("key %s: %d admitted, want 6", k, got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := nodes[2].Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	WaitRings(t, nodes[:2])
	for i, k := range keys {
		if got := admitted(nodes[i%2], k, 3); got != 0 {
			t.Fatalf("key %s: %d admitted after n2 left with its count at the limit, want 0", k, got)
		}
	}
}
