package ownership

// The replica-gained event (docs/ownership.md): a table change that gives
// a partition this node owns a replica not in its row before.

import "github.com/sluicehq/sluice/ring"

// ReplicasGained returns, indexed by partition, whether this node (self)
// owns the partition in cur and cur's row for it (owner and replicas) has
// a member that old's row did not; nil when no partition has one.
func ReplicasGained(old, cur *ring.Table, self string) []bool {
	if old == nil || cur == nil || old.Partitions() != cur.Partitions() {
		return nil
	}
	var gained []bool
	var oldRow, curRow []ring.Member
	sc := cur.Index(self)
	if sc < 0 {
		return nil
	}
	for p := range cur.Partitions() {
		if cur.PartitionOwnerIndex(p) != sc {
			continue
		}
		oldRow = old.PartitionReplicas(p, oldRow[:0])
		curRow = cur.PartitionReplicas(p, curRow[:0])
		for _, m := range curRow[1:] {
			if !RowHas(oldRow, m.Name) {
				if gained == nil {
					gained = make([]bool, cur.Partitions())
				}
				gained[p] = true
				break
			}
		}
	}
	return gained
}

// RowHas reports whether a member named name is in row.
func RowHas(row []ring.Member, name string) bool {
	for _, m := range row {
		if m.Name == name {
			return true
		}
	}
	return false
}

// CopiesFollow returns, indexed by partition, the gRPC address of the
// node to which this node (self) sends its copies of the partition's keys
// after a table change from old to cur ("" for none; nil when none). Self
// was one of the partition's replicas in old, not its owner, and is not
// its owner in cur:
//   - the partition has a new owner in cur: the copies go to it. The old
//     owner hands its keys on (Lost), but when it crashed, or never held
//     them (it restarted, or never settled them), a replica's copy may be
//     the only one left, and the new owner pulls it only on first touch:
//     should the replica crash first, the count would be lost. The new
//     owner merges the copies without settling the keys (Step, Replicate).
//   - the owner is the same, and self is no longer in its row: the copies
//     go to the member that took self's place. The owner re-replicates to
//     its new replica (ReplicasGained), but an owner that crashed and is
//     not yet declared dead does not, and self's copy would be left where
//     nobody asks for it: the next owner pulls the old row, not self.
func CopiesFollow(old, cur *ring.Table, self string) []string {
	if old == nil || cur == nil || old.Partitions() != cur.Partitions() {
		return nil
	}
	var to []string
	var oldRow, curRow []ring.Member
	so, sc := old.Index(self), cur.Index(self)
	if so < 0 {
		return nil // not in old's rows
	}
	for p := range cur.Partitions() {
		// By member number first: this walks every partition on every
		// event, and self was a replica of few.
		if c := cur.PartitionOwnerIndex(p); c < 0 || c == sc || old.PartitionOwnerIndex(p) == so || !old.InRow(p, so) {
			continue
		}
		o, _ := cur.PartitionOwner(p)
		oldRow = old.PartitionReplicas(p, oldRow[:0])
		target := o.Addr
		if oldRow[0].Name == o.Name {
			curRow = cur.PartitionReplicas(p, curRow[:0])
			if RowHas(curRow, self) {
				continue // still a replica of the same owner: nothing moved
			}
			target = ""
			for _, m := range curRow[1:] {
				if !RowHas(oldRow, m.Name) {
					target = m.Addr
					break
				}
			}
			if target == "" {
				continue
			}
		}
		if to == nil {
			to = make([]string, cur.Partitions())
		}
		to[p] = target
	}
	return to
}
