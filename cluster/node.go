package cluster

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
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

	deleg  *delegate
	roster roster
	ml     atomic.Pointer[memberlist.Memberlist]

	stop     chan struct{}
	wg       sync.WaitGroup
	started  atomic.Bool
	joined   atomic.Bool
	leaveMu  sync.Mutex
	left     bool
	shutOnce sync.Once
	shutErr  error

	checks        atomic.Uint64 // requests answered through Check
	forwarded     atomic.Uint64 // requests sent to an owner
	forwardErrors atomic.Uint64 // requests whose owner could not be reached
	rate          atomic.Uint64 // math.Float64bits of checks per second
	lastWarn      atomic.Int64  // Unix ns of the last owner-unavailable log line
}

// New validates cfg, opens the durable store under cfg.DataDir and builds a
// node whose ring holds only itself. It starts nothing.
func New(cfg Config, peers Peers) (*Node, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
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
	cc := cfg.Cache
	if cc.Logger == nil {
		cc.Logger = lg
	}
	cache, err := writeback.New(cc, store)
	if err != nil {
		store.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n := &Node{
		cfg:   cfg,
		name:  cfg.Name,
		log:   lg,
		now:   cfg.Now,
		ring:  r,
		cache: cache,
		peers: peers,
		stop:  make(chan struct{}),
	}
	n.deleg = &delegate{roster: &n.roster, changed: make(chan struct{}, 1)}
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
	ml := n.ml.Load()
	if ml == nil {
		return ""
	}
	return ml.LocalNode().Address()
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
	if mc.Logger == nil && mc.LogOutput == nil {
		mc.Logger = log.New(slogWriter{n.log}, "", 0)
	}
	ml, err := memberlist.Create(&mc)
	if err != nil {
		return fmt.Errorf("cluster: gossip on %s:%d: %w", mc.BindAddr, mc.BindPort, err)
	}
	n.ml.Store(ml)
	n.rebuild()
	n.cache.Start(ctx)
	n.wg.Add(2)
	go n.rebuildLoop()
	go n.rateLoop()
	if len(n.cfg.Join) == 0 {
		n.joined.Store(true)
		return nil
	}
	if n.tryJoin() {
		return nil
	}
	n.wg.Add(1)
	go n.joinLoop()
	return nil
}

func (n *Node) tryJoin() bool {
	ml := n.ml.Load()
	k, err := ml.Join(n.cfg.Join)
	if k > 0 {
		n.joined.Store(true)
		n.log.Info("joined cluster", "contacted", k, "members", ml.NumMembers())
		return true
	}
	n.log.Warn("join failed; retrying", "seeds", strings.Join(n.cfg.Join, ","), "err", err)
	return false
}

func (n *Node) joinLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.JoinRetry)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			if n.tryJoin() {
				return
			}
		}
	}
}

// Ready reports whether the node has started and, when it was given seeds,
// has joined through one of them.
func (n *Node) Ready() bool {
	return n.started.Load() && n.joined.Load() && !n.leaving()
}

func (n *Node) leaving() bool {
	n.leaveMu.Lock()
	defer n.leaveMu.Unlock()
	return n.left
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

// rebuild sets the ring to memberlist's current alive and suspect members.
// A member whose metadata does not decode is left out and logged.
func (n *Node) rebuild() {
	ml := n.ml.Load()
	nodes := ml.Members()
	ms := make([]ring.Member, 0, len(nodes))
	for _, m := range nodes {
		md, err := decodeMeta(m.Meta)
		if err != nil {
			n.log.Warn("member left out of the ring: bad metadata", "member", m.Name, "gossip_addr", m.Address(), "err", err)
			continue
		}
		ms = append(ms, ring.Member{Name: m.Name, Addr: md.grpcAddr})
	}
	if err := n.ring.SetMembers(ms); err != nil {
		n.log.Error("ring not rebuilt", "err", err)
		return
	}
	n.log.Debug("ring rebuilt", "members", len(ms))
}

func (n *Node) rateLoop() {
	defer n.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last, lastAt := n.checks.Load(), time.Now()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			c := n.checks.Load()
			r := float64(c-last) / now.Sub(lastAt).Seconds()
			n.rate.Store(math.Float64bits(r))
			last, lastAt = c, now
		}
	}
}

// Leave tells the gossip pool this node is leaving, waiting up to
// LeaveTimeout (or ctx) for the message to reach a member. The node keeps
// answering forwarded checks until Shutdown. It is safe to call more than
// once.
func (n *Node) Leave(ctx context.Context) error {
	n.leaveMu.Lock()
	defer n.leaveMu.Unlock()
	if n.left {
		return nil
	}
	n.left = true
	ml := n.ml.Load()
	if ml == nil {
		return nil
	}
	timeout := n.cfg.LeaveTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	// Tell the others this is a graceful leave, then leave.
	n.deleg.setMeta(meta{grpcAddr: n.cfg.GRPCAddr, leaving: true})
	if err := ml.UpdateNode(timeout / 2); err != nil {
		n.log.Warn("leaving flag not gossiped", "err", err)
	}
	if err := ml.Leave(timeout); err != nil {
		return fmt.Errorf("cluster: leave: %w", err)
	}
	return nil
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
	now := n.now().UnixNano()
	tbl := n.ring.Table()
	var remote []route
	for i := range reqs {
		r := &reqs[i]
		lim, ok := n.prepare(r, &out[i])
		if !ok {
			continue
		}
		h := ring.Hash(r.Name, r.Key)
		owner, ok := tbl.Owner(h)
		if !ok || owner.Name == n.name {
			n.decide(h, r, lim, now, &out[i])
			continue
		}
		remote = append(remote, route{i: i, hash: h, lim: lim, owner: owner})
	}
	n.checks.Add(uint64(len(reqs)))
	if len(remote) > 0 {
		n.forward(ctx, reqs, out, remote, now)
	}
}

// CheckForwarded decides reqs that the node from forwarded here. It never
// forwards again (hop limit 1), whatever this node's view of the ring.
func (n *Node) CheckForwarded(ctx context.Context, from string, reqs []bucket.Request, out []bucket.Outcome) {
	now := n.now().UnixNano()
	for i := range reqs {
		r := &reqs[i]
		lim, ok := n.prepare(r, &out[i])
		if !ok {
			continue
		}
		n.decide(ring.Hash(r.Name, r.Key), r, lim, now, &out[i])
	}
}

// prepare validates r and resolves its limit; when it fails it fills o with
// the error and returns false.
func (n *Node) prepare(r *bucket.Request, o *bucket.Outcome) (bucket.Limit, bool) {
	*o = bucket.Outcome{}
	if err := r.Validate(); err != nil {
		o.Err = err.Error()
		return bucket.Limit{}, false
	}
	if r.Limit.Limit != 0 || r.WindowMS != 0 {
		return r.Limit, true
	}
	if n.cfg.Rules != nil {
		if lim, ok := n.cfg.Rules.Lookup(r.Name); ok {
			return lim, true
		}
	}
	o.Err = fmt.Sprintf("no limit given and no rule for name %q", r.Name)
	return bucket.Limit{}, false
}

// decide answers r from the local cache.
func (n *Node) decide(h uint64, r *bucket.Request, lim bucket.Limit, now int64, o *bucket.Outcome) {
	d, err := n.cache.Decide(h, writeback.Key{Name: r.Name, Key: r.Key}, lim, r.Hits, now)
	o.Owner = n.name
	if err != nil {
		o.Err = err.Error()
		return
	}
	o.Decision = d
}

// route is a request bound for another node.
type route struct {
	i     int
	hash  uint64
	lim   bucket.Limit
	owner ring.Member
}

// forward sends the remote requests, one call per owner, the calls to
// different owners in parallel.
func (n *Node) forward(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, remote []route, now int64) {
	groups := groupByOwner(remote)
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

func groupByOwner(remote []route) [][]route {
	var groups [][]route
	for len(remote) > 0 {
		owner := remote[0].owner.Name
		var g, rest []route
		for _, rt := range remote {
			if rt.owner.Name == owner {
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

func (n *Node) forwardGroup(ctx context.Context, reqs []bucket.Request, out []bucket.Outcome, g []route, now int64) {
	sub := make([]bucket.Request, len(g))
	subOut := make([]bucket.Outcome, len(g))
	for j, rt := range g {
		sub[j] = reqs[rt.i]
		sub[j].Limit = rt.lim
	}
	owner := g[0].owner
	fctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
	err := n.peers.Forward(fctx, owner.Addr, sub, subOut)
	cancel()
	n.forwarded.Add(uint64(len(g)))
	if err == nil {
		for j, rt := range g {
			out[rt.i] = subOut[j]
		}
		return
	}
	n.forwardErrors.Add(uint64(len(g)))
	if ctx.Err() != nil {
		for _, rt := range g {
			out[rt.i] = bucket.Outcome{Owner: n.name, Err: "check abandoned: " + ctx.Err().Error()}
		}
		return
	}
	n.warnUnavailable(owner, err, len(g))
	for j, rt := range g {
		o := &out[rt.i]
		if n.cfg.OwnerUnavailable == OwnerUnavailableDeny {
			*o = bucket.Outcome{Owner: n.name, Decision: bucket.Decision{
				Status:       bucket.OverLimit,
				Limit:        rt.lim.Limit,
				RetryAfterMS: max(n.cfg.ForwardTimeout.Milliseconds(), 1),
			}}
			continue
		}
		n.decide(rt.hash, &sub[j], rt.lim, now, o)
	}
}

// warnUnavailable logs an unreachable owner at most once a second.
func (n *Node) warnUnavailable(owner ring.Member, err error, k int) {
	now := time.Now().UnixNano()
	last := n.lastWarn.Load()
	if now-last < int64(time.Second) || !n.lastWarn.CompareAndSwap(last, now) {
		return
	}
	n.log.Warn("owner unreachable; applying policy", "owner", owner.Name, "owner_addr", owner.Addr,
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
	ReplicationFactor int
	Partitions        int
}

// Status returns the node's view of the cluster.
func (n *Node) Status() Status {
	tbl := n.ring.Table()
	shares := tbl.Shares()
	var live []MemberStatus
	if ml := n.ml.Load(); ml != nil {
		for _, m := range ml.Members() {
			md, _ := decodeMeta(m.Meta)
			live = append(live, MemberStatus{Name: m.Name, GRPCAddr: md.grpcAddr, State: stateName(m.State), Share: shares[m.Name]})
		}
	} else {
		live = []MemberStatus{{Name: n.name, GRPCAddr: n.cfg.GRPCAddr, State: StateAlive, Share: shares[n.name]}}
	}
	return Status{
		Node:              n.name,
		Ready:             n.Ready(),
		Members:           n.roster.merge(live),
		Keys:              n.cache.Len(),
		ChecksPerSecond:   math.Float64frombits(n.rate.Load()),
		Checks:            n.checks.Load(),
		Forwarded:         n.forwarded.Load(),
		ForwardErrors:     n.forwardErrors.Load(),
		ReplicationFactor: n.cfg.Ring.ReplicationFactor,
		Partitions:        n.cfg.Ring.Partitions,
	}
}

// slogWriter turns memberlist's log lines into slog records.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
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
