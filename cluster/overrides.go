package cluster

// Runtime overrides (package overrides): the node's table, kept in a file
// beside the store and spread by gossip. A change made on one node goes
// out as a memberlist broadcast, which every node that applies it sends on
// (an epidemic: every node within a few gossip rounds), and memberlist's
// push/pull state sync carries the whole table to a joiner and mends what
// a broadcast missed.

import (
	"path/filepath"
	"sync/atomic"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/overrides"
)

// overrideState is the node's side of the overrides.
type overrideState struct {
	table *overrides.Table
	path  string // "" when not kept on disk
	queue *memberlist.TransmitLimitedQueue
	// save wakes the saver; refused counts records refused from gossip
	// or the file.
	save    chan struct{}
	refused atomic.Uint64
	applied atomic.Uint64
}

// overridesFile is the file of the table in a node's data dir.
const overridesFile = "overrides"

// initOverrides makes the node's table and fills it from its file.
func (n *Node) initOverrides() {
	o := &n.ovr
	o.table = overrides.NewTable()
	o.save = make(chan struct{}, 1)
	switch {
	case n.cfg.OverridesFile != "":
		o.path = n.cfg.OverridesFile
	case n.cfg.DataDir != "":
		o.path = filepath.Join(n.cfg.DataDir, overridesFile)
	}
	o.queue = &memberlist.TransmitLimitedQueue{RetransmitMult: 4, NumNodes: func() int {
		if ml := n.ml.Load(); ml != nil {
			return ml.NumMembers()
		}
		return 1
	}}
	if o.path == "" {
		return
	}
	recs, err := overrides.ReadFile(o.path)
	if err != nil {
		o.refused.Add(1)
		n.log.Error("overrides file refused; starting without it, the cluster's overrides come back by gossip", "err", err)
		return
	}
	for _, r := range recs {
		if _, err := o.table.Apply(r); err != nil {
			o.refused.Add(1)
			n.log.Error("override in the file refused", "err", err)
		}
	}
}

// saveLoop writes the table to its file after each change.
func (n *Node) saveLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.ovr.save:
			n.saveOverrides()
		}
	}
}

func (n *Node) saveOverrides() {
	if n.ovr.path == "" {
		return
	}
	if err := overrides.WriteFile(n.ovr.path, n.ovr.table.Records()); err != nil {
		n.log.Error("overrides not written to disk; they are in memory and on the other nodes", "path", n.ovr.path, "err", err)
	}
}

// changedOverrides records a change of the table: saved, and, for a
// record this node set or learnt from a broadcast, sent on.
func (n *Node) changedOverrides(o overrides.Override, broadcast bool) {
	n.ovr.applied.Add(1)
	select {
	case n.ovr.save <- struct{}{}:
	default:
	}
	if broadcast {
		n.ovr.queue.QueueBroadcast(overrideBroadcast{o.Target, overrides.EncodeOne(o)})
	}
}

// overrideBroadcast is one record on its way by gossip; a newer record of
// the same target replaces it in the queue.
type overrideBroadcast struct {
	target overrides.Target
	msg    []byte
}

func (b overrideBroadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(overrideBroadcast)
	return ok && o.target == b.target
}
func (b overrideBroadcast) Message() []byte { return b.msg }
func (b overrideBroadcast) Finished()       {}

// overrideMsg applies a record another node broadcast (delegate.NotifyMsg).
func (n *Node) overrideMsg(b []byte) {
	recs, err := overrides.Decode(b)
	if err != nil {
		n.ovr.refused.Add(1)
		n.log.Warn("gossip message refused", "err", err)
		return
	}
	n.applyOverrides(recs, true)
}

// overrideState is the table for a push/pull (delegate.LocalState); nil
// when it holds nothing, as a node without overrides sends.
func (n *Node) overrideLocalState() []byte {
	recs := n.ovr.table.Records()
	if len(recs) == 0 {
		return nil
	}
	return overrides.EncodeSet(recs)
}

// overrideMerge applies a peer's table (delegate.MergeRemoteState).
func (n *Node) overrideMerge(b []byte) {
	if len(b) == 0 {
		return
	}
	recs, err := overrides.Decode(b)
	if err != nil {
		n.ovr.refused.Add(1)
		n.log.Warn("peer's overrides refused", "err", err)
		return
	}
	n.applyOverrides(recs, false)
}

func (n *Node) applyOverrides(recs []overrides.Override, broadcast bool) {
	for _, r := range recs {
		changed, err := n.ovr.table.Apply(r)
		if err != nil {
			n.ovr.refused.Add(1)
			n.log.Warn("override from a peer refused", "err", err)
			continue
		}
		if changed {
			n.changedOverrides(r, broadcast)
		}
	}
}

// SetOverride puts o's limits in force for o's target on every node
// (docs/operations.md, "Overrides"): this node stamps it (version, origin,
// time), applies it, keeps it on disk and gossips it. o.SetBy and o.Note
// are the caller's. It returns the record as stored.
func (n *Node) SetOverride(o overrides.Override) (overrides.Override, error) {
	now := n.now().UnixNano()
	o.Deleted = false
	o.Origin, o.SetAt = n.name, now
	o.SetBy = overrides.TruncateUTF8(o.SetBy, overrides.MaxNoteLen)
	o, err := n.ovr.table.Stamp(o, now)
	if err != nil {
		return o, err
	}
	n.changedOverrides(o, true)
	return o, nil
}

// DeleteOverride ends the override of t on every node, reporting false
// when none is in force.
func (n *Node) DeleteOverride(t overrides.Target, setBy string) (bool, error) {
	held, ok := n.ovr.table.Get(t)
	if !ok || held.Deleted {
		return false, nil
	}
	now := n.now().UnixNano()
	o, err := n.ovr.table.Stamp(overrides.Override{Target: t, Deleted: true, Origin: n.name,
		SetBy: overrides.TruncateUTF8(setBy, overrides.MaxNoteLen), SetAt: now}, now)
	if err != nil {
		return false, err
	}
	n.changedOverrides(o, true)
	return true, nil
}

// Overrides lists the overrides in force for name ("" for all).
func (n *Node) Overrides(name string) []overrides.Override { return n.ovr.table.List(name) }

// OverrideStats are the overrides in force, the records applied, and the
// records refused from gossip or the file.
func (n *Node) OverrideStats() (live int, applied, refused uint64) {
	return n.ovr.table.Live(), n.ovr.applied.Load(), n.ovr.refused.Load()
}

// OverrideLimitsOf returns the limits an override sets for key of name.
func (n *Node) OverrideLimitsOf(name, key string) ([]bucket.Limit, bool) {
	return n.ovr.table.Lookup(name, key)
}

// overrideLimits returns the limits an override sets for (name, key).
func (n *Node) overrideLimits(name, key string) (limits, bool) {
	ls, ok := n.ovr.table.Lookup(name, key)
	if !ok {
		return limits{}, false
	}
	return limits{one: &ls[0], more: ls[1:]}, true
}
