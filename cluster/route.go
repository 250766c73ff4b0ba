package cluster

// Routing and deciding checks: here, at the owner, at a replica, or by the
// unavailable-owner policy.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/lease"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// Check decides reqs and fills out (len(out) == len(reqs)): each request is
// validated, then decided here when this node owns its key, or forwarded to
// its owner, one call per owner. Invalid requests get their own Err and do
// not affect the others.
// A request with Reset is refused: Node.ResetKey resets keys.
func (n *Node) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	n.check(ctx, reqs, out, false)
}

// errResetNotACheck refuses a client's check that asks a reset.
const errResetNotACheck = "reset_key is not a check's: reset a key with Admin/ResetKey (sluice keys reset)"

// errLeaseNotACheck refuses a client's check that asks a lease operation.
const errLeaseNotACheck = "lease_op is not a check's: use RateLimiter/Acquire, Renew and Release"

// check is Check. For admin, the key administration's own checks: a key
// another node owns is always asked of its owner, never decided from a
// quota lease this node holds (DrainKey: draining a lease would leave the
// owner's count as it was), and a request may Reset.
func (n *Node) check(ctx context.Context, reqs []check.Request, out []check.Outcome, admin bool) {
	if n.refusedAll(out) {
		return
	}
	now := n.now().UnixNano()
	n.pauseCheck(now) // before the table and the moves are read
	tbl := n.ring.Table()
	var deferred []uint64
	if n.life.inRing() {
		deferred = n.presettle(ctx, reqs, false, true, now, func(h uint64) bool {
			owner, ok := tbl.Owner(h)
			return !ok || owner.Name == n.name
		})
	}
	var remote, unsettled []routed
	for i := range reqs {
		r := &reqs[i]
		if r.Reset && !admin {
			out[i] = check.Outcome{Err: errResetNotACheck}
			continue
		}
		if r.Op != check.OpNone && !admin {
			out[i] = check.Outcome{Err: errLeaseNotACheck}
			continue
		}
		lims, ok := n.prepare(r, false, &out[i])
		if !ok {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		owner, ok := tbl.Owner(h)
		if !ok || owner.Name == n.name || n.handedByOwner(r, lims, owner, now) {
			var to string
			if slices.Contains(deferred, h) {
				out[i] = check.Outcome{Owner: n.name, Err: errUnsettled}
			} else {
				to = n.decide(ctx, h, r, lims, ownership.Event{Kind: ownership.Check}, now, &out[i])
			}
			if to == "" {
				if out[i].Err == errUnsettled && ctx.Err() == nil {
					// Not decided here: as if this node, its owner, had
					// not answered (errUnsettled).
					unsettled = append(unsettled, routed{i: i, hash: h, lims: lims, owner: ring.Member{Name: n.name, Addr: n.cfg.GRPCAddr}})
				}
				continue
			}
			owner = ring.Member{Addr: to}
		}
		if !admin && n.leases.Len() > 0 && len(lims.more) == 0 && r.ReserveTTLMS == 0 && r.ReservationID == "" && r.Op == check.OpNone && lease.Leasable(lims.one, r.Hits) &&
			n.leases.Take(lease.Key{Name: r.Name, Key: r.Key, Limit: *lims.one}, r.Hits, now, &out[i].Decision) {
			// Decided from a lease the key's owner granted here (or
			// refused from a refusal lease).
			out[i].Owner = n.name
			n.hitters.Note(h, r.Name, r.Key, r.Hits, out[i].Decision.Allowed(), now)
			continue
		}
		remote = append(remote, routed{i: i, hash: h, lims: lims, owner: owner})
	}
	n.stats.checks.Add(uint64(len(reqs)))
	n.wakeRate()
	if len(remote) > 0 {
		n.forward(ctx, reqs, out, remote, now)
	}
	if len(unsettled) > 0 {
		n.failover(ctx, reqs, out, unsettled, n.cfg.GRPCAddr, now)
	}
}

// CheckForwarded decides reqs that the node from forwarded here because it
// sees this node as their owner. A request is never forwarded again: when
// this node sees another node as the key's owner (the two views differ
// during a membership change), or has handed the key on (released to X),
// the item comes back undecided with movedTo[i] that node ("" for the
// decided items), and the sender asks it (docs/ownership.md, "Hops").
func (n *Node) CheckForwarded(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	n.checkHere(ctx, reqs, false, nil, nil, out, movedTo)
}

// CheckForwardedLeasing is CheckForwarded for a sender that keeps quota
// leases: an item of a key the sender checks often enough
// (Config.HotKeyThreshold) may come back with a lease in out[i].Lease
// (docs/leases.md).
func (n *Node) CheckForwardedLeasing(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string) {
	var lessee *uint64
	if n.heat != nil {
		h := ring.Hash(from, "") // the sender, as Heat knows it: once per call
		lessee = &h
	}
	n.checkHere(ctx, reqs, false, nil, lessee, out, movedTo)
}

// CheckStandIn decides reqs that the node from sent here because their
// owner did not answer: this node decides every one from what it holds, as
// the key's replica, whoever owns it in its view. pullFrom is nil or names,
// per request, the node that handed the key here ("" for none): this node
// pulls the key from it first. movedTo is as for CheckForwarded.
func (n *Node) CheckStandIn(ctx context.Context, from string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) {
	n.checkHere(ctx, reqs, true, pullFrom, nil, out, movedTo)
}

// checkHere decides forwarded checks; lessee, when not nil, is the hash of
// the sender to grant leases to.
func (n *Node) checkHere(ctx context.Context, reqs []check.Request, standIn bool, pullFrom []string, lessee *uint64, out []check.Outcome, movedTo []string) {
	clear(movedTo)
	if n.refusedAll(out) {
		return
	}
	n.stats.answered.Add(1)
	n.wakeRate()
	now := n.now().UnixNano()
	n.pauseCheck(now) // before the table and the moves are read
	tbl := n.ring.Table()
	deferred := n.presettle(ctx, reqs, true, !standIn, now, func(h uint64) bool {
		owner, ok := tbl.Owner(h)
		return standIn || !ok || owner.Name == n.name
	})
	for i := range reqs {
		r := &reqs[i]
		lims, ok := n.prepare(r, true, &out[i])
		if !ok {
			continue
		}
		ev := ownership.Event{Kind: ownership.Forwarded}
		if standIn {
			ev = ownership.Event{Kind: ownership.StandIn}
			if pullFrom != nil {
				ev.From = pullFrom[i]
			}
		}
		h := ring.Hash(r.Name, r.Key)
		if slices.Contains(deferred, h) {
			// The sender fails it over (errUnsettled).
			out[i] = check.Outcome{Owner: n.name, Err: errUnsettled}
			continue
		}
		movedTo[i] = n.decide(ctx, h, r, lims, ev, now, &out[i])
		if lessee != nil && movedTo[i] == "" {
			n.grant(ctx, h, r, lims, ev, *lessee, now, &out[i])
		}
	}
}

// Leases of hot keys (docs/leases.md): the owner's side.
const (
	heatSlots = 4096                   // (key, sender) pairs whose rate is kept
	heatTick  = 100 * time.Millisecond // over which a rate is counted
)

// grant, on the owner of r's key, after o answered r for the node whose
// name hashes to from: when that node sends the key's hits at
// HotKeyThreshold or more, and got no lease of it in the last half lease,
// it admits a slice of the limit at once — what it would spend in a lease's lifetime, or twice its last
// lease when it spent that early, at most half of what is left — and puts
// it in o.Lease for that node to spend.
func (n *Node) grant(ctx context.Context, h uint64, r *check.Request, lims limits, ev ownership.Event, from uint64, now int64, o *check.Outcome) {
	if o.Err != "" || r.Reset || r.ReserveTTLMS > 0 || r.ReservationID != "" || r.Op != check.OpNone || len(lims.more) > 0 || !lease.Leasable(lims.one, r.Hits) {
		return
	}
	if _, away := n.away(h, lims); away {
		return // decided from the home region's slices: not lent on
	}
	// Refused checks count toward the sender's rate too: a key refused
	// to the end of one window is hot at the start of the next.
	ttl := lease.TTL(lims.one, now, n.cfg.LeaseTTL)
	refused := o.Status == bucket.OverLimit
	rate, ok, spent := n.heat.Observe(h, from, r.Hits, now, n.cfg.HotKeyThreshold, ttl/2, (o.Allowed() || refused) && ttl > 0)
	if !ok {
		return
	}
	if refused {
		if until := lease.RefusalTTL(o.RetryAfterMS, ttl); until > 0 {
			o.Lease = check.Lease{TTL: until}
			n.stats.leaseRefusals.Add(1)
		}
		return
	}
	size := lease.Size(rate, ttl, o.Remaining, spent)
	if size == 0 {
		return
	}
	g := *r
	g.Hits = size
	var gd check.Outcome
	if n.decide(ctx, h, &g, lims, ev, now, &gd) != "" || gd.Err != "" || !gd.Allowed() {
		return
	}
	n.heat.Granted(h, from, now, size)
	o.Lease = check.Lease{Tokens: size, TTL: ttl, GrantedAt: now}
	o.Remaining = gd.Remaining
	n.stats.leaseGrants.Add(1)
	n.stats.leaseTokens.Add(uint64(size))
}

// presettle settles at once (settleBatch) the keys of a batch that this
// node is about to decide (mine says which, by ring hash) and that a recent
// ring change moved here; decide would otherwise settle them one by one.
// It returns the ring hashes of the keys left unsettled for want of an
// answer (settleBatch, with owner), which must not be decided now
// (errUnsettled).
func (n *Node) presettle(ctx context.Context, reqs []check.Request, resolved, owner bool, now int64, mine func(h uint64) bool) (deferred []uint64) {
	ms := n.book.Moves()
	if len(reqs) < 2 || !ms.Active(now) {
		return nil
	}
	s := ownership.NewSettle(n.cfg.GRPCAddr, owner)
	var o check.Outcome
	for i := range reqs {
		r := &reqs[i]
		lims, ok := n.prepare(r, resolved, &o)
		if !ok {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		if !mine(h) {
			continue
		}
		k := writeback.Key{Name: r.Name, Key: r.Key}
		for j := range 1 + len(lims.more) {
			sk := k
			if len(lims.more) > 0 {
				sk = writeback.SubKey(k, j)
			}
			if ms.Unsettled(h, sk, n.name, now) {
				s.Add(h, sk)
			}
		}
	}
	if s.Len() == 0 {
		return nil
	}
	// Under the gate, like a decision: a drain that starts meanwhile hands
	// on what was adopted. A draining node pulls nothing: a pull releases
	// the key at its holder, which would then send its checks here, to a
	// node that is leaving and has already handed its counters on.
	n.gate.RLock()
	if !n.draining() {
		deferred = n.settleBatch(ctx, s, ms, now)
	}
	n.gate.RUnlock()
	return deferred
}

// owning reports whether ev is a check this node decides as the key's
// owner, which it does not decide from an older copy while a member that
// may hold a newer count did not answer (errUnsettled): the check fails
// over instead. A stand-in's or failover's check is that failover, and is
// decided from what the node holds once its pulls are done or failed.
func owning(ev ownership.Event) bool {
	return ev.Kind == ownership.Check || ev.Kind == ownership.Forwarded
}

// decide answers r, an event ev about its key, from the local cache, as
// ownership.Step says, and settles (pulls) an unsettled key first. When the
// key is to be asked elsewhere (this node does not own it in its view, is
// draining, or released it to another node) it leaves o undecided and
// returns that node's address instead; else "".
func (n *Node) decide(ctx context.Context, h uint64, r *check.Request, lims limits, ev ownership.Event, now int64, o *check.Outcome) (redirect string) {
	n.gate.RLock()
	redirect = n.decideGated(ctx, h, r, lims, ev, now, o)
	n.gate.RUnlock()
	return redirect
}

// decideGated is decide with n.gate read-locked: the phase in the facts is
// then the one the decision is made in (drain waits for the gate).
func (n *Node) decideGated(ctx context.Context, h uint64, r *check.Request, lims limits, ev ownership.Event, now int64, o *check.Outcome) (redirect string) {
	k := recordKey(r)
	f := n.facts(n.ring.Table(), h, k, lims, now)
	for {
		eff := ownership.Step(f, ev)
		if n.debug && (!eff.DecidesAsItStands() || f.Released || !f.Owns) {
			// Every step but the plain decision of an owned key.
			n.log.Debug("step", "name", k.Name, "key", k.Key, "event", ev.Kind, "from", ev.From, "after", ev.After, "owns", f.Owns, "owner", f.OwnerAddr,
				"handed_by", f.HandedBy, "unsettled", f.Unsettled, "released", f.Released, "released_to", f.ReleasedTo, "unseen", f.ReleasedToUnseen,
				"effects", fmt.Sprintf("%+v", eff))
		}
		switch {
		case eff.Abandon:
			if eff.NoteGivenUp {
				n.noteGivenUp(k, lims, now)
			}
			o.Owner, o.Err = n.name, abandonedBecause(ctx, ev.After)
			return ""
		case eff.Joining:
			o.Owner, o.Err = n.name, errJoining
			return ""
		case eff.Forward:
			return f.OwnerAddr
		case eff.Redirect != "":
			return eff.Redirect
		}
		// Fences set from here on are releases made while this node takes
		// the key back: another node's pull crossed this one's.
		mark := n.cache.FenceMark()
		if eff.Reclaim {
			// A key released by a handoff whose push is still out: taken
			// back once the push has landed, so that a pull from where it
			// went finds it there (pushing). The wait ends with ctx, and
			// the check is then given up below.
			_ = n.pushing.wait(ctx, h)
		}
		if eff.PullFrom != "" {
			n.pullKey(ctx, h, k, lims, eff.PullFrom, mark)
		}
		if eff.Settle && !n.settleKey(ctx, h, k, lims, now, owning(ev)) {
			ev.After = ownership.NotSettled
			if ctx.Err() != nil {
				ev.After = ownership.Cancelled
			}
			continue
		}
		if eff.Reclaim && !n.carry(h, k, lims, eff, change{mark: mark}, now).reclaimed {
			// Released again while this node took the key back: the step
			// for the new release says where to point, to pull it back once
			// more, or to give up.
			ev.After, ev.Crossings = ownership.Crossed, ev.Crossings+1
			f = n.released(f, k)
			continue
		}
		if eff.PullStandIn {
			n.pullStandIn(ctx, h, k, lims, now)
		}
		if ctx.Err() != nil {
			ev.After = ownership.Cancelled
			continue
		}
		err := n.carryOut(h, k, r, lims, now, o)
		if errors.Is(err, writeback.ErrFenced) && !f.Released {
			// This node had released the key: the step for a released key
			// says where to point, or to take it back.
			ev.After = ownership.Fenced
			f = n.released(f, k)
			continue
		}
		o.Owner = n.name
		if err != nil {
			o.Decision = bucket.Decision{}
			o.Err = err.Error()
			return ""
		}
		n.noteDecided(h, r, &o.Decision, f.Owns, now)
		return ""
	}
}

// abandonedBecause is the error of a check given up (ownership.Effects.
// Abandon) for what became of its previous step.
func abandonedBecause(ctx context.Context, after ownership.Result) string {
	switch after {
	case ownership.NotSettled:
		return errUnsettled
	case ownership.Crossed:
		return abandoned + "the key was pulled from here again while this node took it back"
	case ownership.Cancelled:
		if err := ctx.Err(); err != nil {
			return abandoned + err.Error()
		}
	}
	return abandoned + "given up"
}

// routed is a request bound for another node.
type routed struct {
	i     int
	hash  uint64
	lims  limits
	owner ring.Member
	from  string // the address that pointed here (stand-ins pull from it)
	to    string // where owner pointed it instead of deciding (send's moved routes)
}

// forward sends the remote requests, one call per owner, the calls to
// different owners in parallel.
func (n *Node) forward(ctx context.Context, reqs []check.Request, out []check.Outcome, remote []routed, now int64) {
	if oneAddr(remote) { // the common case (a single check): no grouping
		n.forwardGroup(ctx, reqs, out, remote, now)
		return
	}
	groups := groupByAddr(remote)
	if len(groups) == 1 {
		n.forwardGroup(ctx, reqs, out, groups[0], now)
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.forwardGroup(ctx, reqs, out, g, now)
		}()
	}
	n.forwardGroup(ctx, reqs, out, groups[0], now)
	wg.Wait()
}

// oneAddr reports whether every route goes to the same address.
func oneAddr(remote []routed) bool {
	for _, rt := range remote[1:] {
		if rt.owner.Addr != remote[0].owner.Addr {
			return false
		}
	}
	return true
}

// groupByAddr splits routes by destination address, keeping their order.
func groupByAddr(remote []routed) [][]routed {
	var groups [][]routed
	for len(remote) > 0 {
		addr := remote[0].owner.Addr
		var g, rest []routed
		for _, rt := range remote {
			if rt.owner.Addr == addr {
				g = append(g, rt)
			} else {
				rest = append(rest, rt)
			}
		}
		groups = append(groups, g)
		remote = rest
	}
	return groups
}

// send forwards the routes to addr and fills their answers. It returns the
// routes the peer could not answer (all of them on a transport error) and
// those it pointed elsewhere instead of deciding (their to holds the
// address).
func (n *Node) send(ctx context.Context, addr string, standIn bool, reqs []check.Request, out []check.Outcome, g []routed) (failed, moved []routed) {
	sent := n.now().UnixNano() // before the receiver decides: a lease's lifetime counts from here
	sub, subOut, movedTo := sendBufs(len(g))
	for j, rt := range g {
		sub[j] = reqs[rt.i]
		// The owner gets the resolved limits; it needs no rules.
		sub[j].Limit, sub[j].More = *rt.lims.one, rt.lims.more
	}
	fctx, cancel := n.forwardContext(ctx)
	var err error
	if standIn {
		pullFrom := make([]string, len(g))
		for j, rt := range g {
			pullFrom[j] = rt.from
		}
		err = n.peers.ForwardStandIn(fctx, addr, sub, pullFrom, subOut, movedTo)
	} else {
		err = n.peers.Forward(fctx, addr, sub, subOut, movedTo)
	}
	cancel()
	n.stats.forwarded.Add(uint64(len(g)))
	if err != nil {
		n.stats.forwardErrors.Add(uint64(len(g)))
		n.warnUnavailable(addr, err, len(g))
		return g, nil
	}
	for j, rt := range g {
		if strings.HasPrefix(subOut[j].Err, abandoned) && ctx.Err() == nil {
			// The receiver gave up on the item when the forward's deadline
			// came, deciding nothing, and its answer beat that deadline
			// back here: the item fails over as after a timed-out forward.
			n.stats.forwardErrors.Add(1)
			failed = append(failed, rt)
			continue
		}
		if l := subOut[j].Lease; l.TTL > 0 {
			subOut[j].Lease = check.Lease{}
			n.keepLease(&sub[j], rt.lims, l, sent, subOut[j].ResetAfterMS)
		}
		out[rt.i] = subOut[j]
		if movedTo[j] != "" {
			rt.to = movedTo[j]
			moved = append(moved, rt)
		}
	}
	return failed, moved
}

// keepLease keeps a lease the owner of r's key granted with its answer to
// a check sent at sent. A lease this node could not have asked for (a
// limit it would not lease, or out of bounds) is dropped with a warning.
func (n *Node) keepLease(r *check.Request, lims limits, l check.Lease, sent, resetAfterMS int64) {
	if n.draining() {
		return // it sends every check to its owner until it stops
	}
	if len(lims.more) > 0 || !lease.Leasable(lims.one, r.Hits) ||
		!n.leases.Put(lease.Key{Name: r.Name, Key: r.Key, Limit: *lims.one}, l, r.Hits, sent, resetAfterMS, MaxLeaseTTL) {
		n.log.Warn("dropped an invalid lease from a key's owner", "name", r.Name, "tokens", l.Tokens, "ttl", l.TTL)
		return
	}
	select {
	case n.leaseKick <- struct{}{}:
	default:
	}
}

// abandoned begins the error of a check a node gave up on because its
// context ended: it decided nothing.
const abandoned = "check abandoned: "

// sendBufs returns the slices of a send of n items; for a single item, the
// common case, in one allocation.
func sendBufs(n int) ([]check.Request, []check.Outcome, []string) {
	if n == 1 {
		b := new(struct {
			req   [1]check.Request
			out   [1]check.Outcome
			moved [1]string
		})
		return b.req[:], b.out[:], b.moved[:]
	}
	return make([]check.Request, n), make([]check.Outcome, n), make([]string, n)
}

// forwardContext bounds a forward by ForwardTimeout; a caller's deadline
// that comes sooner already does, and then no timer is made.
func (n *Node) forwardContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= n.cfg.ForwardTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, n.cfg.ForwardTimeout)
}

// forwardGroup forwards routes bound for one address. Items the receiver
// handed to another node are re-sent there once. Items that still have no
// answer go to the key's first replica (which may be this node), and, when
// that fails too, get the owner-unavailable policy.
func (n *Node) forwardGroup(ctx context.Context, reqs []check.Request, out []check.Outcome, g []routed, now int64) {
	failedAddr := g[0].owner.Addr
	failed, moved := n.send(ctx, failedAddr, false, reqs, out, g)
	if len(moved) > 0 {
		// The receiver sees the key elsewhere (views differ while
		// membership changes) or handed it on: ask where it points.
		n.stats.redirects.Add(uint64(len(moved)))
		var stuck []routed
		for _, rg := range groupByAddr(retarget(moved)) {
			f, m := n.send(ctx, rg[0].owner.Addr, false, reqs, out, rg)
			failed = append(failed, f...)
			stuck = append(stuck, m...)
		}
		// Pointed on again: the node the first receiver handed the key to
		// decides it as a stand-in, after pulling the key from that
		// receiver. When the two point at each other (each table names
		// the other the owner while the views differ), the one with the
		// lower address stands in, whichever was asked first: every
		// sender then picks the same node, and the key stays there
		// instead of being pulled from one to the other on every check.
		for _, rg := range groupByAddr(standInRoutes(stuck)) {
			f, m := n.send(ctx, rg[0].owner.Addr, true, reqs, out, rg)
			failed = append(failed, f...)
			failed = append(failed, m...)
		}
	}
	if len(failed) == 0 {
		return
	}
	if ctx.Err() != nil {
		for _, rt := range failed {
			out[rt.i] = check.Outcome{Owner: n.name, Err: abandoned + ctx.Err().Error()}
		}
		return
	}
	n.failover(ctx, reqs, out, failed, failedAddr, now)
}

// standInRoutes returns the stuck routes (first receiver from, second receiver
// owner, which points on to to) bound for their stand-in: the second
// receiver, pulling from the first, or, when the second points back at the
// first, the one of the two with the lower address, pulling from the
// other.
func standInRoutes(stuck []routed) []routed {
	for j, rt := range stuck {
		if rt.to == rt.from && rt.from < rt.owner.Addr {
			rt.owner, rt.from = ring.Member{Addr: rt.from}, rt.owner.Addr
		}
		rt.to = ""
		stuck[j] = rt
	}
	return stuck
}

// retarget points routes at the address their answer moved them to,
// remembering where they came from.
func retarget(moved []routed) []routed {
	again := make([]routed, len(moved))
	for j, rt := range moved {
		rt.from, rt.owner, rt.to = rt.owner.Addr, ring.Member{Addr: rt.to}, ""
		again[j] = rt
	}
	return again
}
