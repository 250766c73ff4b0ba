package cluster

import "github.com/sluicehq/sluice/cluster/hitters"

// TopKeys returns the n keys this node decided with the most admitted or
// refused hits in the last 30 to 60 seconds, heaviest first (package
// hitters: bounded memory, counts that may exceed the true hits by the
// error they carry). Every decision made here counts, as the owner or as
// a stand-in; checks answered from a lease on another node do not.
func (n *Node) TopKeys(by hitters.By, limit int) []hitters.Hitter {
	return n.hitters.Top(by, limit, n.now().UnixNano())
}
