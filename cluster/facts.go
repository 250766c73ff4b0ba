package cluster

// The node's side of the ownership component (package ownership): reading
// a key's facts off the node's phase, table, book and cache for
// ownership.Step, whose effects the callers carry out.

import (
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// facts reads what the step function needs about the key with ring hash h
// at now: the phase, whether this node owns it in tbl (or tbl names
// nobody) and where its owner is, and whether a move still has to settle
// it (k, or with more limits than one, any of their sub-keys). Every
// event's facts are read here (factsIn); the caller adds what only the
// event tells (released).
func (n *Node) facts(tbl *ring.Table, h uint64, k writeback.Key, lims limits, now int64) ownership.Facts {
	return n.factsIn(n.book.Moves(), tbl, h, k, lims, now)
}

// factsIn is facts with the book's moves as ms, read once by a caller
// that reads many keys' facts.
func (n *Node) factsIn(ms ownership.Moves, tbl *ring.Table, h uint64, k writeback.Key, lims limits, now int64) ownership.Facts {
	phase, inRing := n.life.state()
	f := ownership.Facts{Phase: phase, SelfAddr: n.cfg.GRPCAddr, InRing: inRing}
	owner, ok := tbl.Owner(h)
	f.Owns = !ok || owner.Name == n.name
	if !f.Owns {
		f.OwnerAddr = owner.Addr
		f.HandedBy = n.handedBy(k, lims, now)
	}
	if len(ms) > 0 {
		if len(lims.more) == 0 {
			f.Unsettled = ms.Unsettled(h, k, n.name, now)
		}
		for i := 0; i < 1+len(lims.more) && len(lims.more) > 0 && !f.Unsettled; i++ {
			f.Unsettled = ms.Unsettled(h, writeback.SubKey(k, i), n.name, now)
		}
	}
	return f
}

// handedBy is Book.HandedBy for the key k of a check with limits lims (a
// multi-limit key's handoff pushes its sub-keys).
func (n *Node) handedBy(k writeback.Key, lims limits, now int64) string {
	if n.book.HandedRecords() == 0 {
		return ""
	}
	if len(lims.more) > 0 {
		k = writeback.SubKey(k, 0)
	}
	return n.book.HandedBy(k, now)
}

// handedByOwner reports whether owner, the owner of r's key in this
// node's table, handed the key here (ownership.Facts.Decides): this node
// decides it, as the owner would point the check here.
func (n *Node) handedByOwner(r *check.Request, lims limits, owner ring.Member, now int64) bool {
	by := n.handedBy(writeback.Key{Name: r.Name, Key: r.Key}, lims, now)
	return by != "" && by == owner.Addr
}

// released adds to f what this node knows of the release of key k (ring
// hash h) once its cache refused a decision of it: where it went, if
// recorded.
func (n *Node) released(f ownership.Facts, k writeback.Key) ownership.Facts {
	f.Released = true
	f.ReleasedTo, _ = n.book.ReleasedTo(k)
	if f.ReleasedTo != "" && f.ReleasedTo != n.cfg.GRPCAddr {
		// Not in the table for want of news (unknown here, or joining and
		// not ready yet), not because it is leaving, left or died: its
		// table is then no newer than this node's.
		f.ReleasedToUnseen = !n.ring.Table().HasAddr(f.ReleasedTo) && !n.roster.departing(f.ReleasedTo)
	}
	return f
}

// keyHash is the ring hash of a cache key: that of its (name, key), also
// for the sub-keys of multi-limit checks, which live with their key.
func keyHash(k writeback.Key) uint64 {
	b := writeback.BaseKey(k)
	return ring.Hash(b.Name, b.Key)
}
