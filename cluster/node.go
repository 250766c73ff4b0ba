package cluster

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// Node is one Sluice node. See the package doc for its lifecycle.
type Node struct {
	cfg   Config
	name  string
	log   *slog.Logger
	now   func() time.Time
	ring  *ring.Ring
	cache *writeback.Cache
	peers Peers

	deleg      *delegate
	roster     roster
	gossipAddr atomic.Value // string: memberlist's advertised host:port, set by Start
	ml         atomic.Pointer[memberlist.Memberlist]

	stop    chan struct{}
	wg      sync.WaitGroup
	started atomic.Bool
	joined  atomic.Bool
	// refused is set when this node gave up joining for good (its name is
	// taken); fatal then carries the error once.
	refused atomic.Pointer[error]
	fatal   chan error
	// lastJoinErr is the last join error logged; only the goroutine that
	// joins (Start, then joinLoop) touches it.
	lastJoinErr string
	leaveMu     sync.Mutex
	left        bool
	// leavingFlag is left, readable without leaveMu (Leave holds it for
	// the whole announcement and drain).
	leavingFlag atomic.Bool
	shutOnce    sync.Once
	shutErr     error

	rebuildMu  sync.Mutex
	inRing     atomic.Bool             // this node announced metaReady: it takes partitions
	moves      atomic.Pointer[[]*move] // recent ring changes that moved partitions here
	movesMu    sync.Mutex              // held by addMove, the only writer of moves
	releasedTo sync.Map                // writeback.Key → gRPC address of the node that took it; see noteReleased
	// releasedStores counts noteReleased calls since the last sweep of
	// releasedTo, releasedSweepAt is the count that starts the next one,
	// and releasedSweep lets one sweep run at a time.
	releasedStores, releasedSweepAt atomic.Int64
	releasedSweep                   sync.Mutex
	handoffs                        chan handoffJob                   // ring changes that moved partitions away
	draining                        atomic.Bool                       // leaving: decide nothing, redirect everything
	gate                            sync.RWMutex                      // held shared by every local decision; drain takes it
	published                       atomic.Pointer[func(*ring.Table)] // tests: called by rebuild once a new table is current

	checks            atomic.Uint64 // requests answered through Check
	forwarded         atomic.Uint64 // requests sent to an owner
	forwardErrors     atomic.Uint64 // requests whose owner could not be reached
	failovers         atomic.Uint64 // requests answered by a replica after the owner failed
	redirects         atomic.Uint64 // requests re-sent to the node a key moved to
	replicated        atomic.Uint64 // counters sent to replicas
	replicationErrors atomic.Uint64 // counters whose replication failed (retried)
	// replRound is held by the replication round in progress: a round takes
	// the changed keys, so a second round started meanwhile must wait for
	// the first to end before it may say every change has been sent.
	replRound     chan struct{}
	handedOff     atomic.Uint64 // counters pushed to new owners
	handoffErrors atomic.Uint64 // counters whose push failed
	pulls         atomic.Uint64 // first-touch pulls of moved keys
	pullErrors    atomic.Uint64 // pulls whose previous owner did not answer
	rejoins       atomic.Uint64 // members alive again after being declared dead
	pauses        atomic.Uint64 // gaps in the heartbeat: this node did not run (pause.go)
	beat          atomic.Int64  // Unix ns (n.now) of the last heartbeat or noticed pause
	pauseMu       sync.Mutex    // held while a pause is noticed
	rate          atomic.Uint64 // math.Float64bits of checks per second
	load          atomic.Uint64 // math.Float64bits of the process's CPU use in [0, 1]
	lastWarn      atomic.Int64  // Unix ns of the last owner-unavailable log line
	// unreachable: gRPC address → Unix ns until which a side stand-in
	// (sideStandIn) does not try it again.
	unreachable sync.Map
}

// New validates cfg, opens the durable store under cfg.DataDir and builds a
// node whose ring holds only itself. It starts nothing.
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
	store, err := writeback.OpenStore(cfg.DataDir, lg)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n := &Node{
		cfg:       cfg,
		name:      cfg.Name,
		log:       lg,
		now:       cfg.Now,
		ring:      r,
		peers:     peers,
		stop:      make(chan struct{}),
		handoffs:  make(chan handoffJob, 16),
		replRound: make(chan struct{}, 1),
		fatal:     make(chan error, 1),
	}
	cc := cfg.Cache
	if cc.Logger == nil {
		cc.Logger = lg
	}
	// The cache lists changed keys for the replication rounds.
	cc.TrackChanges = cfg.Ring.ReplicationFactor > 1
	n.cache, err = writeback.New(cc, store)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	// A node without seeds is a cluster of its own from the start; one with
	// seeds decides nothing until it has joined (enterRing).
	n.inRing.Store(len(cfg.Join) == 0)
	n.roster.now = n.now
	n.deleg = &delegate{self: cfg.Name, roster: &n.roster, changed: make(chan struct{}, 1), onReturn: n.peerReturned, onRejoin: func(name string) {
		n.rejoins.Add(1)
		n.log.Warn("member alive again after being declared dead: a network partition healed or it restarted; "+
			"each key's newest counter version wins", "member", name)
	}}
	n.deleg.setMeta(n.meta(false, false))
	n.beat.Store(n.now().UnixNano())
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

// Start joins the gossip pool and starts the node's goroutines: the ring
// rebuild loop, the rate meter, the cache's flush and expiry loops and, when
// no seed answers at once, a join loop that retries every JoinRetry until
// one does or the node shuts down.
func (n *Node) Start(ctx context.Context) error {
	if !n.started.CompareAndSwap(false, true) {
		return errors.New("cluster: node already started")
	}
	mc := *n.cfg.Config
	mc.Delegate = n.deleg
	mc.Events = n.deleg
	mc.Ping = n.deleg
	mc.Label = n.cfg.ClusterName
	mc.Conflict = n.deleg
	if mc.DeadNodeReclaimTime == 0 {
		// A member declared dead may come back under its name at another
		// address at once (a restarted container with a new IP): without
		// this memberlist ignores it until it forgets the dead member.
		mc.DeadNodeReclaimTime = time.Nanosecond
	}
	// memberlist's log goes to the node's logger (or where the config sent
	// it), through slogWriter, which also catches its suspicions.
	w := slogWriter{l: n.log, onSuspect: n.roster.suspected, quiet: &repeatFilter{now: n.now}}
	switch {
	case mc.Logger != nil:
		w.next = mc.Logger.Writer()
	case mc.LogOutput != nil:
		w.next = mc.LogOutput
	}
	mc.Logger, mc.LogOutput = log.New(w, "", 0), nil
	ml, err := memberlist.Create(&mc)
	if err != nil {
		return fmt.Errorf("cluster: gossip on %s:%d: %w", mc.BindAddr, mc.BindPort, err)
	}
	n.gossipAddr.Store(ml.LocalNode().Address()) // nothing updates it concurrently yet
	n.ml.Store(ml)
	n.rebuild()
	n.cache.Start(ctx)
	n.beat.Store(n.now().UnixNano())
	n.wg.Add(6)
	go n.heartbeatLoop()
	go n.rebuildLoop()
	go n.rateLoop()
	go n.replicateLoop()
	go n.handoffLoop()
	go n.reconnectLoop()
	if len(n.cfg.Join) == 0 {
		n.joined.Store(true)
		n.enterRing()
		return nil
	}
	if n.tryJoin() {
		if p := n.refused.Load(); p != nil {
			return *p
		}
		return nil
	}
	n.wg.Add(1)
	go n.joinLoop()
	return nil
}

func (n *Node) rebuildLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case <-n.deleg.changed:
			n.rebuild()
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
	for _, m := range nodes {
		if m.state != StateAlive && m.state != StateSuspect {
			// A suspect member is still a member, as in memberlist: only
			// its death moves its partitions.
			continue
		}
		if m.metaErr != nil {
			n.log.Warn("member left out of the ring: bad metadata", "member", m.name, "gossip_addr", m.gossip, "err", m.metaErr)
			continue
		}
		// A leaving member is routed around at once; this node routes
		// around itself only once it drains (until then it decides what
		// nobody has pulled yet).
		if m.name == n.name && (n.draining.Load() || !n.inRing.Load()) {
			continue
		}
		if m.name != n.name && (m.meta.leaving || !m.meta.ready) {
			continue
		}
		ms = append(ms, ring.Member{Name: m.name, Addr: m.meta.grpcAddr})
	}
	if len(ms) == 0 {
		return // a draining node alone: nothing to route to
	}
	old := n.ring.Table()
	cur, err := n.ring.Build(ms)
	if err != nil {
		n.log.Error("ring not rebuilt", "err", err)
		return
	}
	// What moved here is registered before the table is current: a check
	// that reads the new table must find the move and pull the key first.
	// Deciding it from nothing would give it a clock-based version newer
	// than the previous owner's record, which the pull could then not
	// replace.
	var lost bool
	if !n.draining.Load() {
		lost = n.tableChanged(old, cur)
	}
	n.ring.SetTable(cur)
	n.log.Debug("ring rebuilt", "members", len(ms))
	if h := n.published.Load(); h != nil {
		(*h)(cur)
	}
	if lost {
		// After the table is current: the handoff releases the keys that
		// moved away, and checks must by then be routed to their new
		// owners.
		select {
		case n.handoffs <- handoffJob{old: old, cur: cur}:
		default:
			n.log.Warn("handoff queue full; new owners will pull on first touch")
		}
	}
}

func (n *Node) rateLoop() {
	last, lastAt, lastCPU := n.checks.Load(), time.Now(), cpuTime()
	n.every(time.Second, func(now time.Time) bool {
		c, cpu := n.checks.Load(), cpuTime()
		wall := now.Sub(lastAt)
		n.rate.Store(math.Float64bits(float64(c-last) / wall.Seconds()))
		load := float64(cpu-lastCPU) / (float64(wall) * float64(runtime.GOMAXPROCS(0)))
		n.load.Store(math.Float64bits(min(max(load, 0), 1)))
		last, lastAt, lastCPU = c, now, cpu
		return true
	})
}

// Load is the load elastic limits see: the CPU time this process used in
// the last second divided by one second × GOMAXPROCS, in [0, 1] (0 until
// the first second has passed). Config.Load replaces it when set.
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

// Leave tells the gossip pool this node is leaving, waiting up to
// LeaveTimeout (or ctx) for the message to reach a member; a message no
// member took up in time is logged, not returned (the members are
// stopping too, or will see the node fail). Before leaving the pool it
// hands every counter to its next owner, within HandoffTimeout (or ctx);
// when some were not handed off it logs how many and returns an error
// saying so (they remain in the store and on their replicas). The node
// keeps answering forwarded checks until Shutdown. It is safe to call more
// than once; later calls return nil.
func (n *Node) Leave(ctx context.Context) error {
	n.leaveMu.Lock()
	defer n.leaveMu.Unlock()
	if n.left {
		return nil
	}
	n.left = true
	n.leavingFlag.Store(true)
	ml := n.ml.Load()
	if ml == nil {
		return nil
	}
	timeout := n.cfg.LeaveTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	// First tell the others this is a graceful leave: they drop this node
	// from their rings and pull its keys on first touch (each pull releases
	// the key here), while this node still decides the keys nobody pulled.
	// Once the news has spread, stop deciding, route around this node, hand
	// every remaining counter to its next owner, then leave.
	n.deleg.setMeta(n.meta(true, true))
	if err := ml.UpdateNode(timeout / 2); err != nil {
		n.log.Warn("leaving flag not gossiped", "err", err)
	}
	t := time.NewTimer(n.cfg.LeavePropagation)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	n.draining.Store(true)
	n.rebuild()
	hctx, cancel := context.WithTimeout(ctx, n.cfg.HandoffTimeout)
	derr := n.drain(hctx)
	cancel()
	// memberlist's only error here is that the leave message did not go
	// out in time, which happens when the other members are stopping too
	// (a whole cluster's SIGTERM). The counters are handed off (or derr
	// says which were not) and flushed by now, and members that missed
	// the message see this node fail instead, so the stop is still
	// graceful.
	if err := ml.Leave(timeout); err != nil {
		n.log.Warn("leave message not confirmed; members still running will detect the node as failed instead",
			"timeout", timeout, "err", err)
	}
	return derr
}

// Shutdown leaves the gossip pool (if Leave was not called), stops the
// memberlist and every goroutine the node started, flushes the cache and
// closes the store. It returns every error, among them Leave's when it
// leaves here (an incomplete handoff); later calls return them too.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutOnce.Do(func() {
		errs := []error{n.Leave(ctx)}
		if ml := n.ml.Load(); ml != nil {
			errs = append(errs, ml.Shutdown())
		}
		close(n.stop)
		n.wg.Wait()
		errs = append(errs, n.cache.Close(ctx))
		n.shutErr = errors.Join(errs...)
	})
	return n.shutErr
}
