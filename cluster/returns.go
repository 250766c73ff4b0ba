package cluster

// Lease returns (docs/leases.md): a holder gives back the hits of leases
// it did not spend, and the owner takes them back into the key's counter.

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/lease"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// ReturnPeers is a Peers that also carries lease returns (Peer/Return).
// A node whose Peers does not implement it returns nothing: its unspent
// leased hits stay unused until their window ends.
type ReturnPeers interface {
	Return(ctx context.Context, addr string, rets []check.LeaseReturn) (taken []int64, err error)
}

// maxReturnBatch is the most returns in one call to one owner.
const maxReturnBatch = 1000

// leaseLoop, while this node holds leases or has returns to send, drops
// the leases that ended (Table.Sweep) and sends their unspent hits back to
// the keys' owners, every half lease; with no lease it sleeps until
// keepLease wakes it, so an idle node pays nothing for it.
func (n *Node) leaseLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.leaseKick:
		}
		t := time.NewTicker(max(n.cfg.LeaseTTL/2, time.Millisecond))
		for busy := true; busy; {
			select {
			case <-n.stop:
				t.Stop()
				return
			case <-t.C:
			}
			n.leases.Sweep(n.now().UnixNano())
			busy = n.sendReturns() || n.leases.Len() > 0
		}
		t.Stop()
	}
}

// sendReturns sends the returns waiting in the lease table to the keys'
// owners, one call per owner, and reports whether there were any. A
// return whose key this node now owns, or whose owner is unknown, is
// dropped: the ring changed, and the owner forgot the grant
// (Heat.ForgetGrants).
func (n *Node) sendReturns() bool {
	rets := n.leases.TakeReturns(nil)
	if len(rets) == 0 {
		return false
	}
	var hits uint64
	for _, r := range rets {
		hits += uint64(r.Hits)
	}
	defer n.stats.leaseReturnsDone.Add(hits) // whatever came of them
	rp, ok := n.peers.(ReturnPeers)
	if !ok {
		return true
	}
	tbl := n.ring.Table()
	byAddr := map[string][]check.LeaseReturn{}
	for _, r := range rets {
		owner, ok := tbl.Owner(ring.Hash(r.Key.Name, r.Key.Key))
		if !ok || owner.Name == n.name {
			continue
		}
		byAddr[owner.Addr] = append(byAddr[owner.Addr], check.LeaseReturn{
			Request:   check.Request{Name: r.Key.Name, Key: r.Key.Key, Hits: r.Hits, Limit: r.Key.Limit},
			GrantedAt: r.GrantedAt,
		})
	}
	// Returns wait on nothing: a second is long for a peer call, and what
	// does not arrive in it is lost to under-admission only.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for addr, rs := range byAddr {
		for len(rs) > 0 {
			b := rs[:min(len(rs), maxReturnBatch)]
			rs = rs[len(b):]
			taken, err := rp.Return(ctx, addr, b)
			if err != nil {
				n.log.Debug("lease returns not taken", "to", addr, "returns", len(b), "err", err)
				continue
			}
			for _, t := range taken {
				n.stats.leaseGaveBack.Add(uint64(t))
			}
		}
	}
	return true
}

// ReturnLeases takes back the hits of leases this node granted the node
// from that it did not spend (peer.LeaseReturner): for each return,
// when this node decides the key now, has a record of the grant
// (Heat.Return: at most what is left of it, once) and the counter still
// counts the grant's window (bucket.Refund). taken[i] is what came back
// of rets[i].
func (n *Node) ReturnLeases(ctx context.Context, from string, rets []check.LeaseReturn, taken []int64) {
	clear(taken)
	if n.heat == nil {
		return
	}
	fh := ring.Hash(from, "")
	n.gate.RLock()
	defer n.gate.RUnlock()
	now := n.now().UnixNano()
	tbl := n.ring.Table()
	for i := range rets {
		if ctx.Err() != nil {
			return
		}
		r := &rets[i].Request
		var o check.Outcome
		lims, ok := n.prepare(r, true, &o)
		if !ok || len(lims.more) > 0 || !lease.Leasable(lims.one, r.Hits) {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		k := writeback.Key{Name: r.Name, Key: r.Key}
		eff := ownership.Step(n.facts(tbl, h, k, lims, now), ownership.Event{Kind: ownership.Forwarded})
		if !eff.DecidesAsItStands() {
			continue
		}
		hits := n.heat.Return(h, fh, rets[i].GrantedAt, r.Hits)
		if hits == 0 {
			continue
		}
		back, err := n.cache.Refund(h, k, lims.one, hits, rets[i].GrantedAt, now)
		if err != nil {
			continue
		}
		taken[i] = back
		n.stats.leaseTookBack.Add(uint64(back))
	}
}
