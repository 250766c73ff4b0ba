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
	for p := range cur.Partitions() {
		if o, ok := cur.PartitionOwner(p); !ok || o.Name != self {
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
