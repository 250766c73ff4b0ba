package cluster

// Hooks for the tests of package cluster_test (the simulated cluster of
// cluster/clustertest, which package cluster's own tests cannot import):
// each exposes one internal of a node. Compiled into the tests only.

import (
	"context"

	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
)

// PauseQueryTimeout is pauseQueryTimeout: the longest a round of pause
// questions takes.
const PauseQueryTimeout = pauseQueryTimeout

// ToPhase moves n's lifecycle to p (lifecycle.to).
func (n *Node) ToPhase(p ownership.Phase) (from ownership.Phase, ok bool) { return n.life.to(p) }

// Presettle settles a batch's moved keys before its decisions (presettle).
func (n *Node) Presettle(ctx context.Context, reqs []check.Request, resolved, owner bool, now int64, mine func(h uint64) bool) []uint64 {
	return n.presettle(ctx, reqs, resolved, owner, now, mine)
}

// SettleBatch carries out s's pulls with no move of the book (settleBatch).
func (n *Node) SettleBatch(ctx context.Context, s *ownership.Settle, now int64) []uint64 {
	return n.settleBatch(ctx, s, nil, now)
}

// Book returns n's record of moves and releases.
func (n *Node) Book() *ownership.Book { return n.book }

// Rebuild rebuilds n's ring from its membership (rebuild).
func (n *Node) Rebuild() { n.rebuild() }

// RegionSync runs one round of n's asks to the home regions (regionSync).
func (n *Node) RegionSync() { n.regionSync() }

// HomeRegion returns the home region of the key key of the limit name.
func (n *Node) HomeRegion(name, key string) string { return n.regions.home(ring.Hash(name, key)) }

// NoteRemoved records in n's ledger that n took the member name out of
// its ring now.
func (n *Node) NoteRemoved(name string) { n.ledger.Removed(name, n.now().UnixNano()) }

// MeterIdle reports whether n's rate meter stopped for want of checks.
func (n *Node) MeterIdle() bool { return n.meter.idle.Load() }
