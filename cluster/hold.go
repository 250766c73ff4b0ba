package cluster

// Concurrency limits (docs/algorithms.md, "Concurrency limits"): at most
// a limit of holders of a key at once, each holding a lease until it
// releases it or its TTL passes without a renew. The holders are a record
// of their own beside the key's counters (writeback.HoldersKey), decided,
// replicated, handed over and failed over as a counter is.

import (
	"context"
	"math/rand/v2"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/writeback"
)

// Hold carries out r, an operation on the concurrency limit of r's key
// (r.Op), at the key's owner as a check is (never from a quota lease).
func (n *Node) Hold(ctx context.Context, r check.Request) check.Outcome {
	out := []check.Outcome{{}}
	n.check(ctx, []check.Request{r}, out, true)
	return out[0]
}

// holdCache carries out r's operation on the holders record k in the
// cache under lim (Limit holders, leases of WindowMS).
func (n *Node) holdCache(h uint64, k writeback.Key, lim *bucket.Limit, r *check.Request, now int64, o *check.Outcome) error {
	id := int64(0)
	if r.Op == check.OpAcquire {
		id = rand.Int64N(1<<62) + 1 // unguessable, so that no other client releases it
	}
	var d bucket.Decision
	var lease int64
	err := n.cache.Update(h, k, now, func(st *bucket.State) {
		switch r.Op {
		case check.OpAcquire:
			d = bucket.Acquire(st, lim.Limit, lim.WindowMS, id, now)
			if d.Allowed() {
				lease = id
			}
		case check.OpRenew:
			var ok bool
			if d, ok = bucket.Renew(st, lim.Limit, lim.WindowMS, r.LeaseID, now); ok {
				lease = r.LeaseID
			}
		case check.OpRelease:
			var ok bool
			if d, ok = bucket.Release(st, lim.Limit, r.LeaseID, now); ok {
				lease = r.LeaseID
			}
		}
	})
	if err != nil {
		return err
	}
	o.Decision, o.LeaseID = d, lease
	return nil
}
