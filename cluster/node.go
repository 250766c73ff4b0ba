package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/sluicehq/sluice/bucket"
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
	leaveMu sync.Mutex
	left    bool
	// leavingFlag is left, readable without leaveMu (Leave holds it for
	// the whole announcement and drain).
	leavingFlag atomic.Bool
	shutOnce    sync.Once
	shutErr     error

	rebuildMu  sync.Mutex
	inRing     atomic.Bool                       // this node announced metaReady: it takes partitions
	moves      atomic.Pointer[[]*move]           // recent ring changes that moved partitions here
	releasedTo sync.Map                          // writeback.Key → gRPC address of the node that took it
	handoffs   chan handoffJob                   // ring changes that moved partitions away
	draining   atomic.Bool                       // leaving: decide nothing, redirect everything
	gate       sync.RWMutex                      // held shared by every local decision; drain takes it
	published  atomic.Pointer[func(*ring.Table)] // tests: called by rebuild once a new table is current

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
	rate          atomic.Uint64 // math.Float64bits of checks per second
	load          atomic.Uint64 // math.Float64bits of the process's CPU use in [0, 1]
	lastWarn      atomic.Int64  // Unix ns of the last owner-unavailable log line
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
	n.deleg = &delegate{self: cfg.Name, roster: &n.roster, changed: make(chan struct{}, 1), onReturn: n.peerReturned, onRejoin: func(name string) {
		n.rejoins.Add(1)
		n.log.Warn("member alive again after being declared dead: a network partition healed or it restarted; "+
			"each key's newest counter version wins", "member", name)
	}}
	n.deleg.setMeta(meta{grpcAddr: cfg.GRPCAddr})
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
	w := slogWriter{l: n.log, onSuspect: n.roster.suspected}
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
	n.wg.Add(5)
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

// Fatal delivers, once, the error that made the node give up for good
// after Start returned: a join retried in the background found this node's
// name taken by another member. The node then decides nothing (its checks
// get the error) and should be shut down.
func (n *Node) Fatal() <-chan error { return n.fatal }

// tryJoin joins through the seeds; it reports whether joining is over:
// joined, or refused because another live member has this node's name.
func (n *Node) tryJoin() bool {
	ml := n.ml.Load()
	k, err := ml.Join(n.cfg.Join)
	if other := n.deleg.nameConflict(); other != "" {
		n.refuseName(other)
		return true
	}
	if k > 0 {
		// Join has merged the seed's full membership (the callbacks ran):
		// this node now knows every member and can take its partitions.
		n.joined.Store(true)
		n.log.Info("joined cluster", "contacted", k, "members", ml.NumMembers())
		n.enterRing()
		return true
	}
	n.log.Warn("join failed; retrying", "seeds", strings.Join(n.cfg.Join, ","), "err", err)
	return false
}

// refuseName gives up joining: the member at other (gossip address) has
// this node's name, and memberlist keeps that member, so this node would
// decide keys nobody routes to it while the others decide them too. The
// node stops gossiping without announcing a leave (a leave under this name
// would remove the other member from every ring).
func (n *Node) refuseName(other string) {
	err := fmt.Errorf("cluster: node name %q is already used by the member at %s (gossip); "+
		"every node needs its own --node-name: this node does not join", n.name, other)
	n.log.Error("node name taken; not joining", "name", n.name, "other_gossip_addr", other)
	n.leaveMu.Lock()
	n.left = true // Leave must not announce anything under this name
	n.leavingFlag.Store(true)
	n.leaveMu.Unlock()
	n.refused.Store(&err)
	n.fatal <- err
	if ml := n.ml.Load(); ml != nil {
		ml.Shutdown()
	}
}

func (n *Node) joinLoop() {
	n.every(n.cfg.JoinRetry, func(time.Time) bool { return !n.tryJoin() })
}

// every calls fn every d until fn returns false or the node stops, on a
// goroutine counted in n.wg by the caller.
func (n *Node) every(d time.Duration, fn func(now time.Time) bool) {
	defer n.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			if !fn(now) {
				return
			}
		}
	}
}

// reconnectLoop tries, every ReconnectInterval, to join the members that
// were declared dead (not those that left): memberlist does not look for
// them once they are dead, so without this the two sides of a healed
// partition would stay apart. A restarted or healed member answers and the
// gossip pools merge.
func (n *Node) reconnectLoop() {
	n.every(n.cfg.ReconnectInterval, func(time.Time) bool {
		var addrs []string
		for _, m := range n.roster.all() {
			if m.state == StateDead && m.name != n.name {
				addrs = append(addrs, m.gossip)
			}
		}
		if len(addrs) > 0 && !n.leaving() {
			if k, _ := n.ml.Load().Join(addrs); k > 0 {
				n.log.Info("reached members declared dead", "members", k)
			}
		}
		return true
	})
}

// PeerWaker is implemented by Peers that keep a connection per peer
// (transport.PeerClient): when a member comes back after a crash or a
// leave, its connection, possibly waiting out a reconnect backoff, is told
// to reconnect at once.
type PeerWaker interface {
	ResetBackoff(addr string)
}

// peerReturned wakes the connection to a member that is back.
func (n *Node) peerReturned(m memberInfo) {
	if pw, ok := n.peers.(PeerWaker); ok && m.metaErr == nil {
		pw.ResetBackoff(m.meta.grpcAddr)
	}
}

// errJoining answers checks a node gets before it has joined the cluster.
const errJoining = "node is joining the cluster and decides nothing yet; ask another node"

// enterRing announces that this node takes its partitions (metaReady) and
// puts it in its own ring. Keys that move to it are pulled from their
// previous owners, computed from the ring just before.
func (n *Node) enterRing() {
	n.rebuild() // the others' ring, without this node
	n.leaveMu.Lock()
	defer n.leaveMu.Unlock()
	if n.left {
		return
	}
	n.inRing.Store(true)
	n.deleg.setMeta(meta{grpcAddr: n.cfg.GRPCAddr, ready: true})
	if err := n.ml.Load().UpdateNode(n.cfg.LeaveTimeout); err != nil {
		n.log.Warn("ready flag not gossiped yet", "err", err)
	}
	n.rebuild()
}

// Ready reports whether the node has started and, when it was given seeds,
// has joined through one of them.
func (n *Node) Ready() bool {
	return n.started.Load() && n.joined.Load() && !n.leaving()
}

// leaving reports whether Leave has begun (the leave may still be being
// announced: the node then decides what nobody has pulled from it).
func (n *Node) leaving() bool { return n.leavingFlag.Load() }

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
// stopping too, or will see the node fail). The node keeps answering
// forwarded checks until Shutdown. It is safe to call more than once.
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
	n.deleg.setMeta(meta{grpcAddr: n.cfg.GRPCAddr, leaving: true, ready: true})
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
	// (a whole cluster's SIGTERM). The counters are handed off and
	// flushed by now, and members that missed the message see this node
	// fail instead, so the stop is still graceful.
	if err := ml.Leave(timeout); err != nil {
		n.log.Warn("leave message not confirmed; members still running will detect the node as failed instead",
			"timeout", timeout, "err", err)
	}
	return derr
}

// Shutdown leaves the gossip pool (if Leave was not called), stops the
// memberlist and every goroutine the node started, flushes the cache and
// closes the store. It returns the first error; later calls return it too.
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

// Check decides reqs and fills out (len(out) == len(reqs)): each request is
// validated, then decided here when this node owns its key, or forwarded to
// its owner, one call per owner. Invalid requests get their own Err and do
// not affect the others.
func (n *Node) Check(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome) {
	if n.refusedAll(out) {
		return
	}
	now := n.now().UnixNano()
	tbl := n.ring.Table()
	if n.inRing.Load() {
		n.presettle(ctx, reqs, false, now, func(h uint64) bool {
			owner, ok := tbl.Owner(h)
			return !ok || owner.Name == n.name
		})
	}
	var remote []route
	for i := range reqs {
		r := &reqs[i]
		lims, ok := n.prepare(r, false, &out[i])
		if !ok {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		owner, ok := tbl.Owner(h)
		if !ok || owner.Name == n.name {
			if !n.inRing.Load() {
				// Joining: what this node holds may be stale, and the
				// cluster has not handed it anything yet.
				out[i] = bucket.Outcome{Owner: n.name, Err: errJoining}
				continue
			}
			n.decide(ctx, h, r, lims, now, &out[i])
			if out[i].MovedTo == "" {
				continue
			}
			owner = ring.Member{Addr: out[i].MovedTo}
			out[i].MovedTo = ""
		}
		remote = append(remote, route{i: i, hash: h, lims: lims, owner: owner})
	}
	n.checks.Add(uint64(len(reqs)))
	if len(remote) > 0 {
		n.forward(ctx, reqs, out, remote, now)
	}
}

// refusedAll answers every item with the refusal when this node gave up
// joining (its name is taken): it is no member, neither deciding nor
// forwarding, so its clients learn it at once.
func (n *Node) refusedAll(out []bucket.Outcome) bool {
	p := n.refused.Load()
	if p == nil {
		return false
	}
	for i := range out {
		out[i] = bucket.Outcome{Owner: n.name, Err: (*p).Error()}
	}
	return true
}

// CheckForwarded decides reqs that the node from forwarded here because it
// sees this node as their owner. A request is never forwarded again (hop
// limit 1): when this node sees another node as the key's owner (the two
// views differ during a membership change), or has handed the key on, the
// item comes back undecided with MovedTo that node, and the sender asks it.
func (n *Node) CheckForwarded(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome) {
	n.checkHere(ctx, reqs, out, false)
}

// CheckStandIn decides reqs that the node from sent here because their
// owner did not answer: this node decides every one from what it holds, as
// the key's replica, whoever owns it in its view.
func (n *Node) CheckStandIn(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome) {
	n.checkHere(ctx, reqs, out, true)
}

func (n *Node) checkHere(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, standIn bool) {
	if n.refusedAll(out) {
		return
	}
	now := n.now().UnixNano()
	tbl := n.ring.Table()
	n.presettle(ctx, reqs, true, now, func(h uint64) bool {
		owner, ok := tbl.Owner(h)
		return standIn || !ok || owner.Name == n.name
	})
	for i := range reqs {
		r := &reqs[i]
		lims, ok := n.prepare(r, true, &out[i])
		if !ok {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		if owner, ok := tbl.Owner(h); !standIn && ok && owner.Name != n.name {
			out[i].MovedTo = owner.Addr
			continue
		}
		if standIn && r.PullFrom != "" && r.PullFrom != n.cfg.GRPCAddr {
			n.pullKey(ctx, h, writeback.Key{Name: r.Name, Key: r.Key}, lims, r.PullFrom)
		}
		n.decide(ctx, h, r, lims, now, &out[i])
		if standIn && out[i].MovedTo != "" && !n.leaving() {
			// This node had handed the key on (to the owner its sender
			// could not reach, most often). A redirect would leave the
			// sender to its own policy, deciding from what it holds —
			// nothing, for a key it does not replicate — so the stand-in
			// takes the key back and decides from its copy.
			out[i].MovedTo = ""
			n.reclaim(h, writeback.Key{Name: r.Name, Key: r.Key}, lims)
			n.decide(ctx, h, r, lims, now, &out[i])
		}
	}
}

// presettle settles at once (settleBatch) the keys of a batch that this
// node is about to decide (mine says which, by ring hash) and that a recent
// ring change moved here; decide would otherwise settle them one by one.
func (n *Node) presettle(ctx context.Context, reqs []bucket.Request, resolved bool, now int64, mine func(h uint64) bool) {
	ms := n.moves.Load()
	if ms == nil || len(reqs) < 2 || !anyActive(*ms, now) {
		return
	}
	var items []settleItem
	var o bucket.Outcome
	for i := range reqs {
		r := &reqs[i]
		lims, ok := n.prepare(r, resolved, &o)
		if !ok {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		if !mine(h) {
			continue
		}
		k := writeback.Key{Name: r.Name, Key: r.Key}
		for j := range 1 + len(lims.more) {
			sk := k
			if len(lims.more) > 0 {
				sk = writeback.SubKey(k, j)
			}
			if needsSettle(h, sk, *ms, n.name, now) {
				items = append(items, settleItem{h: h, k: sk})
			}
		}
	}
	if len(items) == 0 {
		return
	}
	// Under the gate, like a decision: a drain that starts meanwhile hands
	// on what was adopted. A draining node pulls nothing: a pull releases
	// the key at its holder, which would then send its checks here, to a
	// node that is leaving and has already handed its counters on.
	n.gate.RLock()
	if !n.draining.Load() {
		n.settleBatch(ctx, items, *ms, now)
	}
	n.gate.RUnlock()
}

// limits are the resolved limits of a request: one, plus more decided
// atomically with it (nil for a single limit, the common case).
type limits struct {
	one  *bucket.Limit // into the request or the rules; never written
	more []bucket.Limit
}

// all returns every limit (allocates; for the multi-limit path).
func (l limits) all() []bucket.Limit {
	return append([]bucket.Limit{*l.one}, l.more...)
}

// prepare validates r and resolves its limits: the inline limit and
// r.More, or r.More alone, or the rules for r.Name. A limit of 0 takes the
// rules (DESIGN §4: "0: take limit and window from the rules file"), even
// when the request also carries a window. A resolved request, forwarded by
// the node that resolved it, carries its limits inline, a rule's limit of 0
// included, and is decided with them: the owner needs no rules. When it
// fails it fills o with the error and returns false.
func (n *Node) prepare(r *bucket.Request, resolved bool, o *bucket.Outcome) (limits, bool) {
	*o = bucket.Outcome{}
	if err := r.Validate(); err != nil {
		o.Err = err.Error()
		return limits{}, false
	}
	switch {
	case r.Limit.Limit != 0 || (resolved && r.WindowMS != 0):
		return limits{one: &r.Limit, more: r.More}, true
	case len(r.More) > 0:
		return limits{one: &r.More[0], more: r.More[1:]}, true
	}
	if n.cfg.Rules != nil {
		if ls, ok := n.cfg.Rules.Lookup(r.Name); ok && len(ls) > 0 {
			return limits{one: &ls[0], more: ls[1:]}, true
		}
	}
	o.Err = fmt.Sprintf("no limit given and no rule for name %q", r.Name)
	return limits{}, false
}

// decide answers r from the local cache. When this node no longer holds the
// key (it is draining, or handed the key to another node) it sets
// o.MovedTo instead.
func (n *Node) decide(ctx context.Context, h uint64, r *bucket.Request, lims limits, now int64, o *bucket.Outcome) {
	n.gate.RLock()
	n.decideGated(ctx, h, r, lims, now, o)
	n.gate.RUnlock()
}

// decideGated is decide with n.gate read-locked.
func (n *Node) decideGated(ctx context.Context, h uint64, r *bucket.Request, lims limits, now int64, o *bucket.Outcome) {
	k := writeback.Key{Name: r.Name, Key: r.Key}
	if n.draining.Load() {
		if owner, ok := n.ring.Table().Owner(h); ok && owner.Name != n.name {
			o.MovedTo = owner.Addr
			return
		}
	}
	if ms := n.moves.Load(); ms != nil {
		if len(lims.more) == 0 {
			n.settle(ctx, h, k, *ms, now)
		} else {
			for i := range 1 + len(lims.more) {
				n.settle(ctx, h, writeback.SubKey(k, i), *ms, now)
			}
		}
	}
	err := n.decideCache(&o.Decision, h, k, lims, r.Hits, now)
	if errors.Is(err, writeback.ErrMoved) {
		// A leaving node still owns every key in its own view, but it
		// never takes back a key another node pulled from it: it points
		// there instead. Taking it back would let the puller, which owns
		// the key in every other view, decide from the same count.
		if owner, ok := n.ring.Table().Owner(h); !ok || owner.Name != n.name || n.leaving() {
			if o.MovedTo = n.movedTo(h, k); o.MovedTo != "" {
				return
			}
		} else if to := n.movedTo(h, k); to != "" && to != n.cfg.GRPCAddr {
			// This node owns the key in its view but had handed it on
			// (views differed): take it back from where it went.
			n.pullKey(ctx, h, k, lims, to)
		}
		n.reclaim(h, k, lims)
		err = n.decideCache(&o.Decision, h, k, lims, r.Hits, now)
	}
	o.Owner = n.name
	if err != nil {
		o.Decision = bucket.Decision{}
		o.Err = err.Error()
	}
}

// decideCache applies hits to k's limits in the cache, with this node's
// load for elastic limits, and writes the decision to *d.
func (n *Node) decideCache(d *bucket.Decision, h uint64, k writeback.Key, lims limits, hits, now int64) error {
	if len(lims.more) == 0 {
		return n.cache.DecideTo(d, h, k, lims.one, hits, now, n.Load())
	}
	all, err := n.cache.DecideAll(h, k, lims.all(), hits, now, n.Load())
	if err == nil {
		*d = all
	}
	return err
}

// reclaim takes back every cache key of k's limits.
func (n *Node) reclaim(h uint64, k writeback.Key, lims limits) {
	if len(lims.more) == 0 {
		n.cache.Reclaim(h, k)
		return
	}
	for i := range 1 + len(lims.more) {
		n.cache.Reclaim(h, writeback.SubKey(k, i))
	}
}

// route is a request bound for another node.
type route struct {
	i     int
	hash  uint64
	lims  limits
	owner ring.Member
	from  string // the address that pointed here (stand-ins pull from it)
}

// forward sends the remote requests, one call per owner, the calls to
// different owners in parallel.
func (n *Node) forward(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, remote []route, now int64) {
	groups := groupByAddr(remote)
	if len(groups) == 1 {
		n.forwardGroup(ctx, reqs, out, groups[0], now)
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.forwardGroup(ctx, reqs, out, g, now)
		}()
	}
	n.forwardGroup(ctx, reqs, out, groups[0], now)
	wg.Wait()
}

// groupByAddr splits routes by destination address, keeping their order.
func groupByAddr(remote []route) [][]route {
	var groups [][]route
	for len(remote) > 0 {
		addr := remote[0].owner.Addr
		var g, rest []route
		for _, rt := range remote {
			if rt.owner.Addr == addr {
				g = append(g, rt)
			} else {
				rest = append(rest, rt)
			}
		}
		groups = append(groups, g)
		remote = rest
	}
	return groups
}

// send forwards the routes to addr and fills their answers. It returns the
// routes the peer could not answer (all of them on a transport error) and
// those it answered with MovedTo (their out holds the new address).
func (n *Node) send(ctx context.Context, addr string, standIn bool, reqs []bucket.Request, out []bucket.Outcome, g []route) (failed, moved []route) {
	sub := make([]bucket.Request, len(g))
	subOut := make([]bucket.Outcome, len(g))
	for j, rt := range g {
		sub[j] = reqs[rt.i]
		// The owner gets the resolved limits; it needs no rules.
		sub[j].Limit, sub[j].More = *rt.lims.one, rt.lims.more
		if standIn {
			sub[j].PullFrom = rt.from
		}
	}
	fctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
	var err error
	if standIn {
		err = n.peers.ForwardStandIn(fctx, addr, sub, subOut)
	} else {
		err = n.peers.Forward(fctx, addr, sub, subOut)
	}
	cancel()
	n.forwarded.Add(uint64(len(g)))
	if err != nil {
		n.forwardErrors.Add(uint64(len(g)))
		n.warnUnavailable(addr, err, len(g))
		return g, nil
	}
	for j, rt := range g {
		out[rt.i] = subOut[j]
		if subOut[j].MovedTo != "" {
			moved = append(moved, rt)
		}
	}
	return nil, moved
}

// forwardGroup forwards routes bound for one address. Items the receiver
// handed to another node are re-sent there once. Items that still have no
// answer go to the key's first replica (which may be this node), and, when
// that fails too, get the owner-unavailable policy.
func (n *Node) forwardGroup(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, g []route, now int64) {
	failedAddr := g[0].owner.Addr
	failed, moved := n.send(ctx, failedAddr, false, reqs, out, g)
	if len(moved) > 0 {
		// The receiver sees the key elsewhere (views differ while
		// membership changes) or handed it on: ask where it points.
		n.redirects.Add(uint64(len(moved)))
		var stuck []route
		for _, rg := range groupByAddr(retarget(moved, out)) {
			f, m := n.send(ctx, rg[0].owner.Addr, false, reqs, out, rg)
			failed = append(failed, f...)
			stuck = append(stuck, m...)
		}
		// Pointed on again: the node the first receiver handed the key to
		// decides it as a stand-in, after pulling the key from that
		// receiver.
		for _, rg := range groupByAddr(stuck) {
			f, m := n.send(ctx, rg[0].owner.Addr, true, reqs, out, rg)
			failed = append(failed, f...)
			failed = append(failed, m...)
		}
	}
	if len(failed) == 0 {
		return
	}
	if ctx.Err() != nil {
		for _, rt := range failed {
			out[rt.i] = bucket.Outcome{Owner: n.name, Err: "check abandoned: " + ctx.Err().Error()}
		}
		return
	}
	n.failover(ctx, reqs, out, failed, failedAddr, now)
}

// retarget points routes at the address their answer moved them to,
// remembering where they came from.
func retarget(moved []route, out []bucket.Outcome) []route {
	again := make([]route, len(moved))
	for j, rt := range moved {
		rt.from, rt.owner = rt.owner.Addr, ring.Member{Addr: out[rt.i].MovedTo}
		again[j] = rt
	}
	return again
}

// failover answers routes whose owner failed from the key's first replica
// other than the failed node: here when that is this node, else by one more
// forward; what remains gets the owner-unavailable policy.
func (n *Node) failover(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, items []route, failedAddr string, now int64) {
	tbl := n.ring.Table()
	var reps []ring.Member
	var local, remote, rest []route
	for _, rt := range items {
		reps = tbl.Replicas(rt.hash, reps[:0])
		var next ring.Member
		for _, r := range reps {
			if r.Addr != failedAddr && r.Addr != rt.owner.Addr {
				next = r
				break
			}
		}
		switch {
		case next.Name == "":
			rest = append(rest, rt)
		case next.Name == n.name:
			local = append(local, rt)
		default:
			rt.owner = next
			remote = append(remote, rt)
		}
	}
	for _, rt := range local {
		n.failovers.Add(1)
		n.decideOrPolicy(ctx, reqs, out, rt, now)
	}
	for _, g := range groupByAddr(remote) {
		f, m := n.send(ctx, g[0].owner.Addr, true, reqs, out, g)
		n.failovers.Add(uint64(len(g) - len(f) - len(m)))
		rest = append(rest, f...)
		rest = append(rest, m...)
	}
	for _, rt := range rest {
		n.unavailable(ctx, reqs, out, rt, now)
	}
}

// decideOrPolicy decides rt here, falling back to the policy when this node
// redirects it too.
func (n *Node) decideOrPolicy(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, rt route, now int64) {
	r := reqs[rt.i]
	out[rt.i] = bucket.Outcome{}
	n.decide(ctx, rt.hash, &r, rt.lims, now, &out[rt.i])
	if out[rt.i].MovedTo != "" {
		n.unavailable(ctx, reqs, out, rt, now)
	}
}

// unavailable applies the owner-unavailable policy to rt.
func (n *Node) unavailable(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, rt route, now int64) {
	if n.cfg.OwnerUnavailable == OwnerUnavailableDeny {
		out[rt.i] = bucket.Outcome{Owner: n.name, Decision: bucket.Decision{
			Status:       bucket.OverLimit,
			Limit:        rt.lims.one.Limit,
			RetryAfterMS: max(n.cfg.ForwardTimeout.Milliseconds(), 1),
		}}
		return
	}
	r := reqs[rt.i]
	out[rt.i] = bucket.Outcome{}
	k := writeback.Key{Name: r.Name, Key: r.Key}
	o := &out[rt.i]
	err := n.decideCache(&o.Decision, rt.hash, k, rt.lims, r.Hits, now)
	if errors.Is(err, writeback.ErrMoved) {
		n.reclaim(rt.hash, k, rt.lims)
		err = n.decideCache(&o.Decision, rt.hash, k, rt.lims, r.Hits, now)
	}
	o.Owner = n.name
	if err != nil {
		o.Decision = bucket.Decision{}
		o.Err = err.Error()
	}
}

// warnUnavailable logs an unreachable peer at most once a second.
func (n *Node) warnUnavailable(addr string, err error, k int) {
	now := time.Now().UnixNano()
	last := n.lastWarn.Load()
	if now-last < int64(time.Second) || !n.lastWarn.CompareAndSwap(last, now) {
		return
	}
	n.log.Warn("peer unreachable; trying the replica, then the policy", "peer_addr", addr,
		"requests", k, "policy", n.cfg.OwnerUnavailable.String(), "err", err)
}

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
	Unreplicated      int // changed keys not yet sent to replicas
	Unflushed         int // changed keys not yet in the store
	RulesHash         string
	ReplicationFactor int
	Partitions        int
}

// Status returns the node's view of the cluster.
func (n *Node) Status() Status {
	tbl := n.ring.Table()
	shares := tbl.Shares()
	var members []MemberStatus
	for _, m := range n.roster.all() {
		members = append(members, MemberStatus{Name: m.name, GRPCAddr: m.meta.grpcAddr, State: m.state, Share: shares[m.name]})
	}
	if len(members) == 0 {
		members = []MemberStatus{{Name: n.name, GRPCAddr: n.cfg.GRPCAddr, State: StateAlive, Share: shares[n.name]}}
	}
	return Status{
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
		Unreplicated:      n.cache.Changed(),
		Unflushed:         n.cache.Dirty(),
		RulesHash:         n.rulesHash(),
		ReplicationFactor: n.cfg.Ring.ReplicationFactor,
		Partitions:        n.cfg.Ring.Partitions,
	}
}

func (n *Node) rulesHash() string {
	if n.cfg.Rules == nil {
		return ""
	}
	return n.cfg.Rules.Hash()
}

// slogWriter turns memberlist's log lines into slog records, or passes
// them to next when the configuration gave memberlist a log of its own, and
// reports the members this node's failure detector suspects.
type slogWriter struct {
	l         *slog.Logger
	next      io.Writer
	onSuspect func(name string)
}

// suspectLine is how memberlist (v0.7) logs a failed probe: "Suspect
// <name> has failed, no acks received". TestStatusShowsSuspect fails if a
// new version words it otherwise.
const (
	suspectPrefix = "memberlist: Suspect "
	suspectSuffix = " has failed, no acks received"
)

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if i := strings.Index(msg, suspectPrefix); i >= 0 && strings.HasSuffix(msg, suspectSuffix) && w.onSuspect != nil {
		w.onSuspect(msg[i+len(suspectPrefix) : len(msg)-len(suspectSuffix)])
	}
	if w.next != nil {
		return w.next.Write(p)
	}
	level := slog.LevelDebug
	switch {
	case strings.Contains(msg, "[ERR]"):
		level = slog.LevelError
	case strings.Contains(msg, "[WARN]"):
		level = slog.LevelWarn
	case strings.Contains(msg, "[INFO]"):
		level = slog.LevelInfo
	}
	w.l.Log(context.Background(), level, msg, "component", "memberlist")
	return len(p), nil
}
