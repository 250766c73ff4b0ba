package cluster

// What a node reports of itself and the cluster.

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/cluster/ownership"
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
	// SettlesDeferred counts moved keys a check found unsettled because no
	// node that may hold a newer count answered its pull, one of them
	// still a member: the check failed over to the key's replica, and the
	// key is pulled again on its next touch.
	SettlesDeferred uint64
	Rejoins         uint64
	// Quota leases of hot keys (docs/leases.md). As a key's owner:
	// LeaseGrants leases granted to other nodes, of LeaseGrantTokens hits
	// in all. As a holder: LeasedKeys keys with a live lease here now;
	// LeasesHeld leases received, of LeaseTokens hits; LeaseDecisions
	// checks decided from them, spending LeaseSpent hits; LeaseUnused hits
	// left when a lease ended or was revoked (admitted by the owner, then by
	// nobody); LeasesRevoked leases dropped on a membership change or leave.
	LeaseGrants      uint64
	LeaseGrantTokens uint64
	LeasedKeys       int
	LeasesHeld       uint64
	LeaseTokens      uint64
	LeaseDecisions   uint64
	LeaseSpent       uint64
	LeaseUnused      uint64
	LeasesRevoked    uint64
	// Refusal leases: granted as an owner (LeaseRefusalGrants), and checks
	// refused from them as a holder (LeaseRefused).
	LeaseRefusalGrants uint64
	LeaseRefused       uint64
	// Returns of unspent leased hits: hits taken back into counters as an
	// owner (LeaseTookBack), and hits the owners took back from this node
	// as a holder (LeaseGaveBack). Of LeaseUnused, LeaseGaveBack were
	// returned: the rest was admitted by nobody.
	LeaseTookBack uint64
	LeaseGaveBack uint64
	// LeaseReturning hits of ended leases this node put up for return,
	// LeaseReturnsDone of those it has sent, or dropped (the call failed,
	// the key's owner changed), whether taken back or not.
	LeaseReturning   uint64
	LeaseReturnsDone uint64
	// Regions (docs/regions.md): this node's region ("" none), hits it
	// lent other regions as a home region's owner, checks it decided from
	// a fallback share while cut off, and what it knows of each other
	// region.
	Region         string
	RegionLent     uint64
	RegionFallback uint64
	RegionLinks    []RegionLink
	Pauses         uint64 // times this node noticed it had not run for longer than ForwardTimeout
	PausesStarved  uint64 // of those, the machine or the cgroup had no CPU for it (starve.go)
	PausesBusy     uint64 // of those, the process ran but not its heartbeat (a long collection)
	IdleResumes    uint64 // decisions that found the pause heartbeat stopped for idleness (HeartbeatIdle)
	HeartbeatIdle  bool   // the pause heartbeat is stopped: nothing was decided here for HeartbeatIdle
	// Rounds of questions to the members after a pause or an idle spell
	// (pausequery.go): narrowed, only the keys others decided were left
	// to pull; kept, every owned key was; skipped, no round was asked
	// because the node pulled too little for one to pay off.
	PauseQueriesNarrowed, PauseQueriesKept, PauseQueriesSkipped uint64
	Unreplicated                                                int // changed keys not yet sent to replicas
	Unflushed                                                   int // changed keys not yet in the store
	RulesHash                                                   string
	ReplicationFactor                                           int
	Partitions                                                  int

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
		Node:                 n.name,
		Ready:                n.Ready(),
		Members:              members,
		Keys:                 n.cache.Len(),
		ChecksPerSecond:      math.Float64frombits(n.meter.rate.Load()),
		Checks:               n.stats.checks.Load(),
		Forwarded:            n.stats.forwarded.Load(),
		ForwardErrors:        n.stats.forwardErrors.Load(),
		Failovers:            n.stats.failovers.Load(),
		Redirects:            n.stats.redirects.Load(),
		Replicated:           n.stats.replicated.Load(),
		ReplicationErrors:    n.stats.replicationErrors.Load(),
		HandedOff:            n.stats.handedOff.Load(),
		HandoffErrors:        n.stats.handoffErrors.Load(),
		Pulls:                n.stats.pulls.Load(),
		PullErrors:           n.stats.pullErrors.Load(),
		SettlesDeferred:      n.stats.settlesDeferred.Load(),
		Rejoins:              n.stats.rejoins.Load(),
		Pauses:               n.stats.pauses.Load(),
		PausesStarved:        n.stats.pausesStarved.Load(),
		PausesBusy:           n.stats.pausesBusy.Load(),
		IdleResumes:          n.stats.idleResumes.Load(),
		HeartbeatIdle:        n.beat.idle.Load(),
		PauseQueriesNarrowed: n.stats.pauseQueriesNarrowed.Load(),
		PauseQueriesKept:     n.stats.pauseQueriesKept.Load(),
		PauseQueriesSkipped:  n.stats.pauseQueriesSkipped.Load(),
		Unreplicated:         n.cache.Changed(),
		Unflushed:            n.cache.Dirty(),
		RulesHash:            n.rulesHash(),
		ReplicationFactor:    n.cfg.Ring.ReplicationFactor,
		Partitions:           n.cfg.Ring.Partitions,
	}
	store := n.cache.StoreState()
	st.StoreWritable, st.StoreUnwritableSince = store.Writable, store.Since
	if store.Err != nil {
		st.StoreError = store.Err.Error()
	}
	st.FlushFailures = n.cache.Stats().FlushErrors
	ls := n.leases.Stats()
	st.LeaseGrants, st.LeaseGrantTokens, st.LeasedKeys = n.stats.leaseGrants.Load(), n.stats.leaseTokens.Load(), n.leases.Len()
	st.LeasesHeld, st.LeaseTokens, st.LeaseDecisions, st.LeaseSpent, st.LeaseUnused, st.LeasesRevoked =
		ls.Granted, ls.Tokens, ls.Decisions, ls.Spent, ls.Unused, ls.Revoked
	st.LeaseRefusalGrants, st.LeaseRefused = n.stats.leaseRefusals.Load(), ls.Refused
	st.LeaseTookBack, st.LeaseGaveBack = n.stats.leaseTookBack.Load(), n.stats.leaseGaveBack.Load()
	st.LeaseReturning, st.LeaseReturnsDone = ls.Returning, n.stats.leaseReturnsDone.Load()
	st.Region, st.RegionLent, st.RegionFallback = n.cfg.Region, n.stats.regionLent.Load(), n.stats.regionFallback.Load()
	st.RegionLinks = n.regionStatus(n.now().UnixNano())
	st.MemberEvents = n.roster.counts()
	st.RecentEvents = n.roster.recentEvents()
	return st
}

// meta is what this node gossips about itself in its current phase: the
// ready flag once it takes its partitions, the leaving flag from its leave
// on (gossipedFlags).
func (n *Node) meta() meta {
	ready, leaving := gossipedFlags(n.life.load())
	return meta{grpcAddr: n.cfg.GRPCAddr, ready: ready, leaving: leaving, sec: n.security(), boot: n.boot, place: placementOf(n.cfg.Ring)}
}

// gossipedFlags returns the ready and leaving flags of a node in phase p:
// neither before it is ready (a refused node never was), ready once it
// is, and both from its leave on (a node that leaves while joining
// announces ready with leaving, which the others read as leaving).
func gossipedFlags(p ownership.Phase) (ready, leaving bool) {
	switch p {
	case ownership.Ready:
		return true, false
	case ownership.Leaving, ownership.Draining, ownership.Left:
		return true, true
	}
	return false, false
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
