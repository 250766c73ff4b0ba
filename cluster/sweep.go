package cluster

// Forgetting what a membership change left behind once its window is over:
// the moves (with the set of keys each settled), the releases of keys
// pulled from this node and where they went. Each is needed for one
// MoveWindow after the change; without a sweep they stay until the next
// change, one entry per key touched in the window, on every node.

import (
	"time"
)

// sweepLoop sweeps every quarter of MoveWindow, so what a change left
// behind is gone at most 1.25 windows after the change.
func (n *Node) sweepLoop() {
	n.every(max(n.cfg.MoveWindow/4, time.Millisecond), func(time.Time) bool {
		n.sweep(n.now().UnixNano())
		return true
	})
}

// sweep drops the moves whose window ended before now, the cache's
// expired releases and the records of where keys no longer released went.
func (n *Node) sweep(now int64) {
	n.cache.DropExpiredFences(now)
	n.book.Sweep(now)
}
