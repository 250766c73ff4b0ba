package cluster

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// A replication round sends only the keys changed since the last round.
// A replica that has no copy of a key the round skips — a member new to
// the key's row, or one back in the ring after a restart that lost the
// copies it had not flushed (a node is out of the ring from its restart
// until it announces itself ready) — would never get one, and a later
// crash of the owner would lose the key's whole count, not only its last
// replication interval's. So when a table change gives a partition this
// node owns a replica that was not in its row before, every key of that
// partition in memory is marked changed, and the next round sends it to
// all its replicas (those that had it keep the newer version); the keys
// of that partition held only in the store (a node with more keys than
// its cache holds) are sent at once. A member
// that restarts so fast that nobody saw it leave the ring is known by its
// boot id, which changes with every process (meta.boot): the keys of the
// partitions it replicates for this node are marked the same way.

// resendToNewReplicas marks changed every key in memory whose partition
// (in tbl) is marked in gained, for the next replication round, and sends
// the keys of those partitions that it holds only in its store (more keys
// than its cache holds) to the partitions' replicas at once, as copies. It
// returns how many it marked and how many it sent.
func (n *Node) resendToNewReplicas(ctx context.Context, tbl *ring.Table, gained []bool, now int64) (marked, sent int) {
	batches := map[string][]bucket.Counter{}
	var reps []ring.Member
	n.rangeHeld(now, gained, func(r writeback.Record, stored bool) bool {
		h := keyHash(r.Key)
		if p := tbl.Partition(h); p >= len(gained) || !gained[p] {
			return true
		}
		if !stored {
			n.cache.MarkChanged(h, r.Key)
			marked++
			return true
		}
		reps = tbl.Replicas(h, reps[:0])
		for _, m := range reps {
			if m.Name != n.name {
				batches[m.Addr] = append(batches[m.Addr], r.Counter())
				sent++
			}
		}
		return true
	})
	n.sendCopies(ctx, batches)
	return marked, sent
}

// rangeHeld calls fn with the record of every key this node holds: those in
// memory (Cache.Range, stored false), then those only in its store
// (Cache.RangeStoredOnly, stored true), until fn returns false. A node
// with more keys than its cache holds keeps the rest in its store, and
// they move and reach new replicas as the others do. parts names the
// partitions the caller wants (nil: all): the cache, which lists its keys
// by partition, visits only theirs, the store, grouped by partition, reads
// only theirs, and fn skips the keys of others it is given. A failed
// read of the store is logged: those keys then move only by the new
// owner's pull on first touch.
func (n *Node) rangeHeld(now int64, parts []bool, fn func(r writeback.Record, stored bool) bool) {
	more := true
	n.cache.RangeIn(now, parts, func(r writeback.Record) bool {
		more = fn(r, false)
		return more
	})
	if !more {
		return
	}
	err := n.cache.RangeStoredOnly(now, keyHash, parts, func(r writeback.Record) bool { return fn(r, true) })
	if err != nil && !errors.Is(err, writeback.ErrClosed) {
		n.log.Warn("reading the store for the keys not in memory failed; those keys move only when their new owner pulls them on first touch", "err", err)
	}
}

// memberRestarted is the delegate's onRestart, on memberlist's goroutine:
// it only queues the name for the rebuild loop.
func (n *Node) memberRestarted(name string) {
	select {
	case n.restarts <- name:
	default:
		n.log.Warn("restart queue full: a restarted member gets only the keys that change", "member", name)
	}
}

// resendForRestart marks for the next replication round the keys of the
// partitions this node owns and the restarted member replicates.
func (n *Node) resendForRestart(name string) {
	tbl := n.ring.Table()
	var gained []bool
	var row []ring.Member
	for p := range tbl.Partitions() {
		row = tbl.PartitionReplicas(p, row[:0])
		if len(row) < 2 || row[0].Name != n.name || !ownership.RowHas(row[1:], name) {
			continue
		}
		if gained == nil {
			gained = make([]bool, tbl.Partitions())
		}
		gained[p] = true
	}
	if gained == nil {
		return
	}
	n.log.Info("member restarted: the keys it replicates for this node go to it again", "member", name)
	select {
	case n.handoffs <- handoffJob{cur: tbl, gained: gained}:
	default:
		n.log.Warn("handoff queue full: a restarted member gets only the keys that change", "member", name)
	}
}
