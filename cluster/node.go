package cluster

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/cluster/hitters"
	"github.com/sluicehq/sluice/cluster/lease"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// stats are a node's event counters (Status reports them; package
// cmd/sluice exports them as metrics).
type stats struct {
	checks            atomic.Uint64 // requests answered through Check
	forwarded         atomic.Uint64 // requests sent to an owner
	forwardErrors     atomic.Uint64 // requests whose owner could not be reached
	failovers         atomic.Uint64 // requests answered by a replica after the owner failed
	redirects         atomic.Uint64 // requests re-sent to the node a key moved to
	replicated        atomic.Uint64 // counters sent to replicas
	replicationErrors atomic.Uint64 // counters whose replication failed (retried)
	handedOff         atomic.Uint64 // counters pushed to new owners
	handoffErrors     atomic.Uint64 // counters whose push failed
	pulls             atomic.Uint64 // first-touch pulls of moved keys
	pullErrors        atomic.Uint64 // pulls whose previous owner did not answer
	settlesDeferred   atomic.Uint64 // moved keys left unsettled: no node asked answered, one still a member
	rejoins           atomic.Uint64 // members alive again after being declared dead
	pauses            atomic.Uint64 // gaps in the heartbeat: this node did not run (pause.go)
	// pausesStarved and pausesBusy count the pauses explained as such
	// (the rest of pauses are stopped).
	pausesStarved, pausesBusy atomic.Uint64
	idleResumes               atomic.Uint64 // decisions that found the heartbeat stopped (counted apart from pauses)
	// Rounds of questions after a pause (pausequery.go): those that
	// narrowed the pause's pulls to the keys others decided, and those
	// that left every owned key to be pulled.
	pauseQueriesNarrowed, pauseQueriesKept atomic.Uint64
	// pauseQueriesSkipped counts the pauses after which a round would
	// have cost more than the pulls it could spare (worthAsking).
	pauseQueriesSkipped atomic.Uint64
	answered            atomic.Uint64 // peer check calls answered here (checkHere): activity for the heartbeat
	leaseGrants         atomic.Uint64 // leases granted as an owner
	leaseTokens         atomic.Uint64 // hits in them
	leaseRefusals       atomic.Uint64 // refusal leases granted as an owner
	// Lease returns: hits this node took back as an owner, and hits the
	// owners took back from it as a holder; leaseReturnsDone, hits of the
	// returns it was done with, taken back or not.
	leaseTookBack, leaseGaveBack, leaseReturnsDone atomic.Uint64
	// regionLent counts hits lent to other regions as a home region's
	// owner, regionFallback checks decided from a fallback share while cut
	// off.
	regionLent, regionFallback atomic.Uint64
}

// Node is one Sluice node. See the package doc for its lifecycle.
type Node struct {
	// stats are the node's counters, exported by Status.
	stats stats

	cfg   Config
	name  string
	log   *slog.Logger
	now   func() time.Time
	ring  *ring.Ring
	cache *writeback.Cache
	peers Peers

	deleg      *delegate
	ovr        overrideState
	reserve    *reservations
	roster     roster
	gossipAddr atomic.Value // string: memberlist's advertised host:port, set by Start
	ml         atomic.Pointer[memberlist.Memberlist]

	stop chan struct{}
	wg   sync.WaitGroup
	// life is the node's phase (lifecycle.go); only life.to changes it.
	life lifecycle
	// refusedErr is why the node was refused (set before the phase
	// becomes refused); fatal then carries it once.
	refusedErr atomic.Pointer[error]
	fatal      chan error
	// lastJoinErr is the last join error logged; only the goroutine that
	// joins (Start, then joinLoop) touches it.
	lastJoinErr string
	// leaveMu is held by Leave for the whole announcement and drain, and
	// by enterRing and refuseName while they change the phase and the
	// gossiped flags together.
	leaveMu  sync.Mutex
	shutOnce sync.Once
	shutErr  error

	rebuildMu sync.Mutex
	// leftOut maps each member rebuild leaves out of the ring for its
	// metadata to why, so that each is warned of once per reason rather
	// than at every rebuild. rebuildMu guards it.
	leftOut map[string]string
	// debug: the logger takes debug records (per-key traces of moves).
	debug bool
	// book holds the ownership records: the moves that brought keys here
	// and where released keys went (package ownership).
	book     *ownership.Book
	handoffs chan handoffJob // ring changes that moved partitions away
	pushing  pushing         // keys released by a handoff whose push is still out
	gate     sync.RWMutex    // held shared by every local decision; drain takes it

	// leases are the quota leases this node holds for keys other nodes
	// own; heat measures, for the keys it owns, how fast each other node
	// sends their checks (nil: it grants no leases). docs/leases.md.
	leases *lease.Table
	heat   *lease.Heat
	// leaseKick wakes leaseLoop when this node keeps a lease.
	leaseKick chan struct{}
	// regions is this node's view of the other regions (nil: no regions).
	regions *regions

	// replRound is held by the replication round in progress: a round takes
	// the changed keys, so a second round started meanwhile must wait for
	// the first to end before it may say every change has been sent.
	replRound chan struct{}
	boot      uint64      // this process's boot id, in the gossiped metadata
	restarts  chan string // members whose boot id changed, for the rebuild loop (rereplicate.go)
	beat      heartbeat
	pause     pauses
	meter     rateMeter
	// ledger records the keys this node decided that others may own,
	// for members that noticed a pause (pausequery.go).
	ledger *ownership.Ledger
	// hitters keeps the heaviest keys decided here (TopKeys).
	hitters  *hitters.Tracker
	deadWake chan struct{} // a member was declared dead: wakes the reconnect loop (capacity 1)
	load     atomic.Uint64 // math.Float64bits of the process's CPU use in [0, 1]
	lastWarn atomic.Int64  // Unix ns of the last owner-unavailable log line
	// unreachable: gRPC address → Unix ns until which a side stand-in
	// (sideStandIn) does not try it again.
	unreachable sync.Map
	// stoodIn: keys whose forwarded checks this node, their owner, gave
	// up on, which a replica may have decided as a stand-in (standins.go).
	stoodIn standIns
}

// heartbeat is the pause heartbeat's state (pause.go, heartbeat.go).
type heartbeat struct {
	last atomic.Int64  // Unix ns (n.now) of the last heartbeat or noticed pause
	idle atomic.Bool   // the heartbeat stopped: nothing was decided for HeartbeatIdle
	wake chan struct{} // wakes the stopped heartbeat (capacity 1)
}

// pauses is what the node knows of its own pauses (pause.go, starve.go,
// pausequery.go).
type pauses struct {
	mu sync.Mutex // held while a pause is noticed, and by the heartbeat's samples
	// Guarded by mu: what explains a gap (starve.go; nil where not
	// started), the CPU counters at the last beat, the ring without this
	// node for cur, and the pause log's rate limit.
	evidence *cpuEvidence
	lastCPU  cpuSample
	prev     *ring.Table
	cur      *ring.Table
	loggedAt int64
	unlogged uint64
	// The pause move the query loop asks about next, and when its pause
	// was noticed (guarded by askMu); wake wakes the loop (capacity 1).
	askMu   sync.Mutex
	asked   *ownership.Move
	noticed time.Time
	pulls   uint64 // stats.pulls when it was noticed
	wake    chan struct{}
}

// rateMeter is the node's measure of its checks per second (rate.go).
type rateMeter struct {
	rate atomic.Uint64 // math.Float64bits of checks per second
	idle atomic.Bool   // the meter stopped for want of checks
	wake chan struct{} // wakes the stopped meter (capacity 1)
}

// New validates cfg, opens the durable store under cfg.DataDir (or takes
// cfg.Store) and builds a node whose ring holds only itself. It starts
// nothing.
func New(cfg Config, peers Peers) (*Node, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = newWallClock().Now
	}
	if peers == nil {
		peers = NoPeers{}
	}
	if cfg.Resolve == nil {
		cfg.Resolve = lookupHost
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	lg := cfg.Log.With("node", cfg.Name)
	r, err := ring.New(cfg.Ring)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := r.SetMembers([]ring.Member{{Name: cfg.Name, Addr: cfg.GRPCAddr}}); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	store := cfg.Store
	if store == nil {
		// The store groups its records by the ring's partitions, so that a
		// ring change reads only the partitions that moved (rangeHeld).
		tbl := r.Table()
		parts := writeback.Partitioning{Count: tbl.Partitions(), Of: func(k writeback.Key) int { return tbl.Partition(keyHash(k)) }}
		if store, err = writeback.OpenPartitionedStore(cfg.DataDir, lg, parts); err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
	}
	n := &Node{
		cfg:       cfg,
		name:      cfg.Name,
		log:       lg,
		now:       cfg.Now,
		ring:      r,
		peers:     peers,
		stop:      make(chan struct{}),
		beat:      heartbeat{wake: make(chan struct{}, 1)},
		pause:     pauses{wake: make(chan struct{}, 1)},
		meter:     rateMeter{wake: make(chan struct{}, 1)},
		deadWake:  make(chan struct{}, 1),
		restarts:  make(chan string, 16),
		boot:      cmp.Or(cfg.BootID, rand.Uint64()) | 1, // never 0
		handoffs:  make(chan handoffJob, 16),
		replRound: make(chan struct{}, 1),
		fatal:     make(chan error, 1),
		leases:    lease.NewTable(),
		leaseKick: make(chan struct{}, 1),
	}
	n.regions = newRegions(&cfg, n.now().UnixNano())
	n.ledger = ownership.NewLedger(ledgerKeep(&cfg), ledgerRoom, n.now().UnixNano())
	n.hitters = hitters.New()
	n.initOverrides()
	n.reserve = newReservations()
	if cfg.HotKeyThreshold > 0 {
		n.heat = lease.NewHeat(heatSlots, heatTick)
	}
	cc := cfg.Cache
	if cc.Logger == nil {
		cc.Logger = lg
	}
	// The cache lists changed keys for the replication rounds, and its
	// keys by ring partition, so that a ring change visits only the keys
	// in memory of the partitions that moved (rangeHeld).
	cc.TrackChanges = cfg.Ring.ReplicationFactor > 1
	first := r.Table() // every table has the same partitions
	cc.Partitions, cc.PartitionOf = first.Partitions(), first.Partition
	n.cache, err = writeback.New(cc, store)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	cache := n.cache
	n.debug = lg.Enabled(context.Background(), slog.LevelDebug)
	n.book = ownership.NewBook(cfg.Name, cfg.MoveWindow, func(k writeback.Key, now int64) bool {
		return cache.Fenced(keyHash(k), k, now)
	})
	// A node without seeds is a cluster of its own from the start; one with
	// seeds decides nothing until it has joined (enterRing).
	if len(cfg.Join) == 0 {
		n.life.alone()
	}
	n.roster.now = n.now
	n.deleg = &delegate{self: cfg.Name, roster: &n.roster, changed: make(chan struct{}, 1), onReturn: n.peerReturned, onRejoin: func(name string) {
		n.stats.rejoins.Add(1)
		n.log.Warn("member alive again after being declared dead: a network partition healed or it restarted; "+
			"each key's newest counter version wins", "member", name)
	}, onRestart: n.memberRestarted, onDead: n.wakeReconnect}
	n.deleg.overrides = overrideHooks{msg: n.overrideMsg, broadcasts: n.ovr.queue.GetBroadcasts, local: n.overrideLocalState, merge: n.overrideMerge}
	n.deleg.setMeta(n.meta())
	n.beat.last.Store(n.now().UnixNano())
	return n, nil
}

// Name returns the node's name.
func (n *Node) Name() string { return n.name }

// Ring returns the node's view of the ring.
func (n *Node) Ring() *ring.Ring { return n.ring }

// Cache returns the node's write-back cache.
func (n *Node) Cache() *writeback.Cache { return n.cache }

// GossipAddr returns the host:port memberlist advertises, once started.
func (n *Node) GossipAddr() string {
	s, _ := n.gossipAddr.Load().(string)
	return s
}

func (n *Node) rebuildLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.deleg.changed:
			n.rebuild()
		case name := <-n.restarts:
			n.resendForRestart(name)
		}
	}
}

// rebuild sets the ring to memberlist's current alive and suspect members,
// less those leaving (and this node itself once it drains), then registers
// what moved. A member whose metadata does not decode is left out and
// logged.
func (n *Node) rebuild() {
	ml := n.ml.Load()
	if ml == nil {
		return
	}
	n.rebuildMu.Lock()
	defer n.rebuildMu.Unlock()
	nodes := n.roster.all()
	ms := make([]ring.Member, 0, len(nodes))
	own := placementOf(n.cfg.Ring)
	leftOut := make(map[string]string)
	for _, m := range nodes {
		if m.state != StateAlive && m.state != StateSuspect {
			// A suspect member is still a member, as in memberlist: only
			// its death moves its partitions.
			continue
		}
		if m.metaErr != nil {
			why := "metadata: " + m.metaErr.Error()
			if n.leftOut[m.name] != why {
				n.log.Warn("member left out of the ring: bad metadata", "member", m.name, "gossip_addr", m.gossip, "err", m.metaErr)
			}
			leftOut[m.name] = why
			continue
		}
		if m.meta.place != own {
			// Its ring would give partitions to other owners than this
			// one's: both deciding would count one key in two places.
			why := "placement: " + m.meta.place.String()
			if n.leftOut[m.name] != why {
				n.log.Warn("member left out of the ring: its ring places partitions otherwise (--ring-partitions, --ring-load)",
					"member", m.name, "gossip_addr", m.gossip, "theirs", m.meta.place.String(), "ours", own.String())
			}
			leftOut[m.name] = why
			continue
		}
		// A leaving member is routed around at once; this node routes
		// around itself only once it drains (until then it decides what
		// nobody has pulled yet).
		if m.name == n.name && (n.draining() || !n.life.inRing()) {
			continue
		}
		if m.name != n.name && (m.meta.leaving || !m.meta.ready) {
			continue
		}
		ms = append(ms, ring.Member{Name: m.name, Addr: m.meta.grpcAddr})
	}
	n.leftOut = leftOut // a member that comes back and is left out again is warned of again
	if len(ms) == 0 {
		return // a draining node alone: nothing to route to
	}
	old := n.ring.Table()
	cur, err := n.ring.Build(ms)
	if err != nil {
		n.log.Error("ring not rebuilt", "err", err)
		return
	}
	// Members taken out, for those that come back from a pause and ask
	// (pausequery.go): others decide their keys as owners now.
	now := n.now().UnixNano()
	for _, m := range old.Members() {
		if !cur.Has(m.Name) {
			n.ledger.Removed(m.Name, now)
		}
	}
	// What moved here is registered before the table is current: a check
	// that reads the new table must find the move and pull the key first.
	// Deciding it from nothing would give it a clock-based version newer
	// than the previous owner's record, which the pull could then not
	// replace.
	//
	// A node not in the ring (joining after a restart, its first tables
	// built before it knows every member) has owned nothing in the
	// cluster's ring since it started: what its store holds is what it
	// decided before, which others have decided since. It hands nothing
	// off and sends no copies.
	inRing := n.life.inRing()
	var lost bool
	if !n.draining() {
		lost = n.tableChanged(old, cur) && inRing
	}
	n.ring.SetTable(cur)
	if n.debug {
		names := make([]string, len(ms))
		for i, m := range ms {
			names[i] = m.Name
		}
		n.log.Debug("ring rebuilt", "members", len(ms), "names", strings.Join(names, ","))
	}
	// A lease is spent only while its key stays with the owner that
	// granted it (docs/leases.md); the keys that did not move keep theirs.
	moved := func(h uint64) bool {
		o, _ := old.Owner(h)
		c, _ := cur.Owner(h)
		return o.Name != c.Name
	}
	if n.leases.Len() > 0 {
		n.leases.Revoke(func(k lease.Key) bool { return moved(ring.Hash(k.Name, k.Key)) })
	}
	if n.heat != nil {
		// The moved keys' counters may now come from nodes that never
		// counted this node's grants: take none of them back.
		n.heat.ForgetGrants(moved)
	}
	if n.regions != nil {
		n.regions.book.Forget(moved)
	}
	if n.cfg.TableChanged != nil {
		n.cfg.TableChanged(cur)
	}
	var gained []bool
	var copyTo []string
	if !n.draining() && inRing {
		gained = ownership.ReplicasGained(old, cur, n.name)
		copyTo = ownership.CopiesFollow(old, cur, n.name)
	}
	if lost || gained != nil || copyTo != nil {
		// After the table is current: the handoff releases the keys that
		// moved away, and checks must by then be routed to their new
		// owners.
		select {
		case n.handoffs <- handoffJob{old: old, cur: cur, lost: lost, gained: gained, copyTo: copyTo}:
		default:
			n.log.Warn("handoff queue full; new owners will pull on first touch, and new replicas get only the keys that change")
		}
	}
}

// Load is the load elastic limits see: the CPU time this process used in
// the last second divided by one second × GOMAXPROCS, in [0, 1] (0 until
// the first second has passed; while the node is idle, the last second
// measured, rateLoop). Config.Load replaces it when set.
func (n *Node) Load() float64 {
	if n.cfg.Load != nil {
		return n.cfg.Load()
	}
	return math.Float64frombits(n.load.Load())
}

// cpuTime returns the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
