package cluster

// What a node reports of itself and the cluster.

import (
	"math"
	"time"
)

// Status is what a node knows of the cluster, for `sluice status`.
type Status struct {
	Node              string
	Ready             bool
	Members           []MemberStatus
	Keys              int
	ChecksPerSecond   float64
	Checks            uint64
	Forwarded         uint64
	ForwardErrors     uint64
	Failovers         uint64
	Redirects         uint64
	Replicated        uint64
	ReplicationErrors uint64
	HandedOff         uint64
	HandoffErrors     uint64
	Pulls             uint64
	PullErrors        uint64
	Rejoins           uint64
	Pauses            uint64 // times this node noticed it had not run for longer than ForwardTimeout
	IdleResumes       uint64 // decisions that found the pause heartbeat stopped for idleness (HeartbeatIdle)
	HeartbeatIdle     bool   // the pause heartbeat is stopped: nothing was decided here for HeartbeatIdle
	Unreplicated      int    // changed keys not yet sent to replicas
	Unflushed         int    // changed keys not yet in the store
	RulesHash         string
	ReplicationFactor int
	Partitions        int

	// StoreWritable is false from a failed flush until one succeeds again
	// (a full or failing disk); StoreError and StoreUnwritableSince say
	// why and since when. The node decides from memory meanwhile.
	StoreWritable        bool
	StoreError           string
	StoreUnwritableSince time.Time
	FlushFailures        uint64 // failed flushes since start

	// MemberEvents counts the joins, leaves, failures and updates of
	// members this node has seen since it started.
	MemberEvents MemberEvents
	// RecentEvents are the last membership changes this node saw (at most
	// RecentEvents of them), newest first.
	RecentEvents []MemberEvent
}

// Status returns the node's view of the cluster.
func (n *Node) Status() Status {
	tbl := n.ring.Table()
	shares := tbl.Shares()
	var members []MemberStatus
	for _, m := range n.roster.all() {
		members = append(members, MemberStatus{Name: m.name, GRPCAddr: m.meta.grpcAddr, State: m.state, Share: shares[m.name], Security: m.meta.sec})
	}
	if len(members) == 0 {
		members = []MemberStatus{{Name: n.name, GRPCAddr: n.cfg.GRPCAddr, State: StateAlive, Share: shares[n.name], Security: n.security()}}
	}
	st := Status{
		Node:              n.name,
		Ready:             n.Ready(),
		Members:           members,
		Keys:              n.cache.Len(),
		ChecksPerSecond:   math.Float64frombits(n.rate.Load()),
		Checks:            n.checks.Load(),
		Forwarded:         n.forwarded.Load(),
		ForwardErrors:     n.forwardErrors.Load(),
		Failovers:         n.failovers.Load(),
		Redirects:         n.redirects.Load(),
		Replicated:        n.replicated.Load(),
		ReplicationErrors: n.replicationErrors.Load(),
		HandedOff:         n.handedOff.Load(),
		HandoffErrors:     n.handoffErrors.Load(),
		Pulls:             n.pulls.Load(),
		PullErrors:        n.pullErrors.Load(),
		Rejoins:           n.rejoins.Load(),
		Pauses:            n.pauses.Load(),
		IdleResumes:       n.idleResumes.Load(),
		HeartbeatIdle:     n.beatIdle.Load(),
		Unreplicated:      n.cache.Changed(),
		Unflushed:         n.cache.Dirty(),
		RulesHash:         n.rulesHash(),
		ReplicationFactor: n.cfg.Ring.ReplicationFactor,
		Partitions:        n.cfg.Ring.Partitions,
	}
	store := n.cache.StoreState()
	st.StoreWritable, st.StoreUnwritableSince = store.Writable, store.Since
	if store.Err != nil {
		st.StoreError = store.Err.Error()
	}
	st.FlushFailures = n.cache.Stats().FlushErrors
	st.MemberEvents = n.roster.counts()
	st.RecentEvents = n.roster.recentEvents()
	return st
}

// meta is what this node gossips about itself.
func (n *Node) meta(ready, leaving bool) meta {
	return meta{grpcAddr: n.cfg.GRPCAddr, ready: ready, leaving: leaving, sec: n.security(), boot: n.boot}
}

// security is how this node is secured: Config.Security, with
// GossipEncrypted from the memberlist configuration.
func (n *Node) security() Security {
	sec := n.cfg.Security
	sec.GossipEncrypted = n.cfg.Config.Keyring != nil || len(n.cfg.Config.SecretKey) > 0
	return sec
}

func (n *Node) rulesHash() string {
	if n.cfg.Rules == nil {
		return ""
	}
	return n.cfg.Rules.Hash()
}
