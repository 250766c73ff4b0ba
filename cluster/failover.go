package cluster

// Failover: answering checks whose owner did not answer, from the key's
// replica, a side stand-in or the owner-unavailable policy (the event
// "forward failure" and the state "standing in" of docs/ownership.md).

import (
	"context"
	"errors"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// failover answers routes whose owner failed from the key's first replica
// other than the failed node: here when that is this node, else by one more
// forward; what remains gets the owner-unavailable policy.
func (n *Node) failover(ctx context.Context, reqs []check.Request, out []check.Outcome, items []routed, failedAddr string, now int64) {
	tbl := n.ring.Table()
	var reps []ring.Member
	var local, remote, rest []routed
	for _, rt := range items {
		reps = tbl.Replicas(rt.hash, reps[:0])
		var next ring.Member
		for _, r := range reps {
			if r.Addr != failedAddr && r.Addr != rt.owner.Addr {
				next = r
				break
			}
		}
		switch {
		case next.Name == "":
			rest = append(rest, rt)
		case next.Name == n.name:
			local = append(local, rt)
		default:
			rt.owner = next
			remote = append(remote, rt)
		}
	}
	for _, rt := range local {
		n.stats.failovers.Add(1)
		n.decideOrPolicy(ctx, reqs, out, rt, now)
	}
	for _, g := range groupByAddr(remote) {
		f, m := n.send(ctx, g[0].owner.Addr, true, reqs, out, g)
		n.stats.failovers.Add(uint64(len(g) - len(f) - len(m)))
		rest = append(rest, f...)
		rest = append(rest, m...)
	}
	if len(rest) > 0 && n.cfg.OwnerUnavailable == OwnerUnavailableServe && ctx.Err() == nil {
		rest = n.sideStandIn(ctx, reqs, out, rest, tbl)
	}
	for _, rt := range rest {
		n.unavailable(ctx, reqs, out, rt, now)
	}
}

// sideStandIn, for the serve policy, sends routes whose owner and replicas
// all failed to one stand-in that every node of this side of a partition
// chooses alike: the first member, in an order fixed by the key (highest
// random weight), that is neither the key's owner nor one of its replicas
// and has not failed a call from here within the last 4 forward timeouts.
// Before the partition is detected every node of a side would otherwise
// decide the key from its own cache, several counts that the side's owner
// after detection can only merge by their maximum; one stand-in per side
// keeps one count, which that owner pulls (settleBatch asks every member
// when the key's holders are gone). It returns the routes to decide here:
// those this node is the stand-in of, and those no stand-in answered.
func (n *Node) sideStandIn(ctx context.Context, reqs []check.Request, out []check.Outcome, rest []routed, tbl *ring.Table) []routed {
	members := tbl.Members()
	if len(members) < 3 {
		return rest
	}
	var local []routed
	var reps []ring.Member
	for len(rest) > 0 && ctx.Err() == nil {
		now := time.Now().UnixNano()
		var remote []routed
		for _, rt := range rest {
			reps = tbl.Replicas(rt.hash, reps[:0])
			to := n.standInFor(rt.hash, members, reps, now)
			if to.Name == "" || to.Name == n.name {
				local = append(local, rt)
				continue
			}
			rt.owner = to
			remote = append(remote, rt)
		}
		rest = rest[:0]
		for _, g := range groupByAddr(remote) {
			f, m := n.send(ctx, g[0].owner.Addr, true, reqs, out, g)
			if len(f) > 0 {
				n.unreachable.Store(g[0].owner.Addr, time.Now().UnixNano()+4*int64(n.cfg.ForwardTimeout))
			}
			n.stats.failovers.Add(uint64(len(g) - len(f) - len(m)))
			rest = append(rest, f...)
			local = append(local, m...) // a stand-in never redirects; defensive
		}
	}
	return append(local, rest...)
}

// standInFor returns the side stand-in of the key with ring hash h (see
// sideStandIn): the member other than reps with the highest weight
// mix(h, member) that has not failed recently; this node counts as never
// failed. The zero Member when there is none.
func (n *Node) standInFor(h uint64, members, reps []ring.Member, now int64) ring.Member {
	var best ring.Member
	var bestW uint64
	for _, m := range members {
		if slices.ContainsFunc(reps, func(r ring.Member) bool { return r.Name == m.Name }) {
			continue
		}
		if m.Name != n.name {
			if until, ok := n.unreachable.Load(m.Addr); ok && until.(int64) > now {
				continue
			}
		}
		if w := mix64(h ^ ring.Hash(m.Name, "")); best.Name == "" || w > bestW {
			best, bestW = m, w
		}
	}
	return best
}

// mix64 is SplitMix64's finalizer: a bijection that spreads every input
// bit over the output.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// decideOrPolicy decides rt here, falling back to the policy when this node
// redirects it too.
func (n *Node) decideOrPolicy(ctx context.Context, reqs []check.Request, out []check.Outcome, rt routed, now int64) {
	r := reqs[rt.i]
	out[rt.i] = check.Outcome{}
	if n.decide(ctx, rt.hash, &r, rt.lims, ownership.Event{Kind: ownership.Failover}, now, &out[rt.i]) != "" {
		n.unavailable(ctx, reqs, out, rt, now)
	}
}

// unavailable applies the owner-unavailable policy to rt.
func (n *Node) unavailable(ctx context.Context, reqs []check.Request, out []check.Outcome, rt routed, now int64) {
	if n.cfg.OwnerUnavailable == OwnerUnavailableDeny {
		out[rt.i] = check.Outcome{Owner: n.name, Decision: bucket.Decision{
			Status:       bucket.OverLimit,
			Limit:        rt.lims.one.Limit,
			RetryAfterMS: max(n.cfg.ForwardTimeout.Milliseconds(), 1),
		}}
		return
	}
	r := reqs[rt.i]
	out[rt.i] = check.Outcome{}
	k := recordKey(&r)
	o := &out[rt.i]
	// The policy decides from what this node holds, whatever its records
	// say (ownership.Serve): a key it had released is taken back, once the
	// cache refused the decision (Fenced).
	ev := ownership.Event{Kind: ownership.Serve}
	f := n.facts(n.ring.Table(), rt.hash, k, rt.lims, now)
	var err error
	for {
		eff := ownership.Step(f, ev)
		if eff.Reclaim {
			n.carry(rt.hash, k, rt.lims, eff, change{mark: math.MaxUint64}, now) // whatever released it
		}
		err = n.carryOut(rt.hash, k, &r, rt.lims, now, o)
		if !errors.Is(err, writeback.ErrFenced) || ev.After == ownership.Fenced {
			break
		}
		ev.After = ownership.Fenced
		f = n.released(f, k)
	}
	o.Owner = n.name
	if err != nil {
		o.Decision = bucket.Decision{}
		o.Err = err.Error()
		return
	}
	n.noteDecided(rt.hash, &r, &o.Decision, false, now) // the owner did not answer: not this node's key
}

// warnUnavailable logs an unreachable peer at most once a second.
func (n *Node) warnUnavailable(addr string, err error, k int) {
	now := time.Now().UnixNano()
	last := n.lastWarn.Load()
	if now-last < int64(time.Second) || !n.lastWarn.CompareAndSwap(last, now) {
		return
	}
	n.log.Warn("peer unreachable; trying the replica, then the policy", "peer_addr", addr,
		"requests", k, "policy", n.cfg.OwnerUnavailable.String(), "err", err)
}
