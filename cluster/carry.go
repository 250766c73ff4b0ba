package cluster

// The executor of ownership's decisions on a key's records: the one place
// the node changes what decides a key here — the cache's release of the
// key (its fence), the installs of other nodes' copies, taking a released
// key back — and the book's record of those changes. ownership.Step and
// ownership.Settle decide; carry and adopt carry out. The effects that go
// over the network (forward, redirect, pull, push, the answers) stay with
// the code that sends or answers them, which hands these what it got (a
// pushed, copied or pulled record) and acts on what they report.
// TestOnlyTheExecutorWritesRecords holds every such call to this file.

import (
	"time"

	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/writeback"
)

// change is what carry needs besides the effects: the record a push or a
// replica copy brought (Adopt, Merge); how long a release lasts and
// whether it must leave a key already released alone (Release: a pull's
// release does not, a handoff's does); the fence mark a taking back must
// not cross (Reclaim: Cache.FenceMark read before the pulls, or
// math.MaxUint64 to lift any release).
type change struct {
	rec        writeback.Record
	ttl        time.Duration
	ifDeciding bool
	mark       uint64
}

// carried is what carry did.
type carried struct {
	// Release: the record handed over (held: the cache had one), or
	// err: writeback.ErrFenced when ifDeciding found the key released
	// already (nothing changed), or a store read that failed.
	rec  writeback.Record
	held bool
	err  error
	// installed: Adopt or Merge changed what the cache holds.
	installed bool
	// reclaimed: Reclaim lifted the release of every cache key of the
	// key's limits; false when a pull released one again after mark.
	reclaimed bool
}

// carry carries out eff's effects on the records of key k (ring hash h,
// limits lims for Reclaim) at now: Release (the cache's fence, the book's
// note of where the key went), Adopt and Merge (the install of c.rec, and
// for an adopted push, that no move pulls it again), Reclaim (the release
// lifted, unless crossed).
func (n *Node) carry(h uint64, k writeback.Key, lims limits, eff ownership.Effects, c change, now int64) (r carried) {
	switch {
	case eff.Release:
		if c.ifDeciding {
			r.rec, r.held, r.err = n.cache.FenceIfDeciding(h, k, now, c.ttl)
		} else {
			r.rec, r.held, r.err = n.cache.Fence(h, k, now, c.ttl)
		}
		// A handoff's release of a key with no record pushes nothing, so
		// there is nowhere to note; a pull's release is noted either way:
		// the puller decides the key now.
		if r.err == nil && (r.held || !c.ifDeciding) {
			n.book.Carried(k, eff, now)
		}
	case eff.Adopt:
		var held bool
		r.installed, held = n.cache.InstallHanded(h, c.rec, eff.HeldSettles)
		// A push that installed nothing told this node nothing newer
		// than it holds: a leaving node's stale replica copy, say. The
		// key stays as it was: unsettled, it is still pulled on first
		// touch; released, a check takes it back from where it went. Its
		// sender still points the key's checks here (HandedFrom). But a
		// push of the very record this node holds (the copy the sender
		// replicated here, the usual case when a key's replica becomes
		// its owner) tells it that it holds the sender's last count: the
		// key is settled as by an install (HeldSettles).
		eff.MarkSettled = eff.MarkSettled && (r.installed || held)
		if eff.MarkSettled || eff.HandedFrom != "" {
			n.book.Carried(k, eff, now)
		}
	case eff.Merge:
		r.installed = n.cache.Merge(h, c.rec)
	}
	if eff.Reclaim {
		r.reclaimed = true
		if len(lims.more) == 0 {
			r.reclaimed = n.cache.UnfenceUnlessFencedAfter(h, k, c.mark)
		} else {
			for i := range 1 + len(lims.more) {
				r.reclaimed = n.cache.UnfenceUnlessFencedAfter(h, writeback.SubKey(k, i), c.mark) && r.reclaimed
			}
		}
	}
	return r
}

// adopt installs rec, the merge of the copies a settle's or a stand-in's
// pull brought, unless the key was released at or after since (Unix ns):
// the node it went to took this node's state and decides it now. It
// reports whether it installed.
func (n *Node) adopt(h uint64, rec writeback.Record, since int64) bool {
	return n.cache.InstallUnlessFencedSince(h, rec, since)
}

// adoptUncrossed is adopt for a pull back (PullFrom), which must not cross
// a release made after mark (Cache.FenceMark), whatever the clock says.
func (n *Node) adoptUncrossed(h uint64, rec writeback.Record, mark uint64) bool {
	return n.cache.InstallUnlessFencedAfter(h, rec, mark)
}
