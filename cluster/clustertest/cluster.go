package clustertest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// Window is the window of every check's limit: a fixed window of one hour,
// so that a run, which lasts a few minutes of the bubble's clock (it starts
// at midnight UTC, on a window edge), stays in one window unless it
// advances time on purpose.
const Window = time.Hour

// Limit names the counters of every check.
const LimitName = "clustertest"

// CheckTimeout bounds every Check: a check not answered by then is an
// error (the cluster must answer every check).
const CheckTimeout = 30 * time.Second

// SettleTimeout bounds Settle, in the bubble's time.
const SettleTimeout = 2 * time.Minute

// settleStep is how far Settle lets time run between two looks.
const settleStep = 50 * time.Millisecond

// The ring of every node (see config).
const (
	Partitions   = 127
	VirtualNodes = 20
)

// Options configures a Cluster.
type Options struct {
	// Configure, when set, is called on every node's config before the
	// node is built (defaults: cluster.DefaultConfig with the fast failure
	// detection, a memory store, the cluster's networks, quiet logs).
	// A node it gives a Region joins only the members of that region:
	// each region is a gossip pool of its own (add a region's first member
	// alone, then the others).
	Configure func(*cluster.Config)
	// Log receives the nodes' logs; nil discards them.
	Log *slog.Logger
	// Peers, when set, wraps the peer network as the member named name
	// calls it, each time the member starts: a test's fault on that
	// node's calls (some held, or failed).
	Peers func(name string, p cluster.Peers) cluster.Peers
	// Seed fixes the order in which peer calls, memberlist's packets and
	// its stream messages reach their receivers
	// (cluster.MemNetwork.SeedDelivery, GossipNetwork.SeedDelivery): each
	// is held for up to DeliverySpread, a time the seed and what is sent
	// fix. It also fixes each node's boot id and the moment within
	// DeliverySpread at which it starts, so that no two nodes' memberlist
	// timers tick at the same moment (see config).
	Seed uint64
	// InstantGossip delivers memberlist's packets and stream messages at
	// once, as they are sent, instead of at seeded moments: the seed then
	// no longer fixes their order. For runs of hundreds of members, which
	// send tens of thousands of packets a simulated second: seeded
	// delivery makes each its own moment of the bubble's clock, and the
	// 50-member scale run took twice as long with it.
	InstantGossip bool
}

// DeliverySpread is the longest a peer call is held by seeded delivery
// (Options.Seed): a network's latency, far below the forward timeout.
const DeliverySpread = time.Millisecond

// State is where a member is.
type State uint8

// The states of a member.
const (
	Up      State = iota + 1 // started, not left or crashed
	Left                     // left gracefully (Leave)
	Crashed                  // killed (Crash)
)

// Member is one node of the cluster under its name, across restarts.
type Member struct {
	Name       string
	GossipAddr string
	PeerAddr   string
	State      State
	// Region is the node's Config.Region (set by Options.Configure): ""
	// without regions.
	Region string
	// Node is the running node (nil unless Up).
	Node *cluster.Node
	// Store is the node's store; after a crash, what its disk held.
	Store *writeback.MemStore
	// OverridesFile is where the node keeps its runtime overrides, kept
	// across its restarts.
	OverridesFile string
}

// Cluster is N nodes in one process, over a GossipNetwork and a
// cluster.MemNetwork, with memory stores. Build it inside a
// testing/synctest bubble (synctest.Test) with the bubble's t: its clock is
// the bubble's, which advances only when every goroutine of the bubble is
// blocked, so timers are realistic and cost no wall-clock time. Its
// methods are called from the bubble's main goroutine, one at a time.
type Cluster struct {
	t        testing.TB
	opts     Options
	dir      string // the members' override files
	Gossip   *GossipNetwork
	Peers    *cluster.MemNetwork
	boots    int // processes configured so far: each gets a boot id of its own
	members  map[string]*Member
	order    []string // names in the order of their first Add
	groups   map[string]int
	drops    bool
	zombies  sync.WaitGroup
	failedMu sync.Mutex
	failed   map[string]int64 // by key: items of forwards that failed
}

// New returns an empty cluster whose nodes all stop when the test ends.
func New(t testing.TB, opts Options) *Cluster {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{t: t, opts: opts, Gossip: NewGossipNetwork(), Peers: cluster.NewMemNetwork(), members: map[string]*Member{},
		failed: map[string]int64{}, dir: t.TempDir()}
	c.Peers.SeedDelivery(opts.Seed, DeliverySpread)
	if !opts.InstantGossip {
		c.Gossip.SeedDelivery(opts.Seed, DeliverySpread)
	}
	t.Cleanup(c.Close)
	return c
}

// Formed returns a new cluster (New) of the named members, added at once
// (AddMany) and settled; it fails t when they do not form.
func Formed(t testing.TB, opts Options, names ...string) *Cluster {
	t.Helper()
	c := New(t, opts)
	if err := c.AddMany(names...); err != nil {
		t.Fatal(err)
	}
	if err := c.Settle(); err != nil {
		t.Fatal(err)
	}
	return c
}

// OwnedBy returns the first n keys prefix0, prefix1, … (of the limit
// LimitName) that owner owns in the table of member via.
func OwnedBy(c *Cluster, via, owner, prefix string, n int) []string {
	tbl := c.Member(via).Node.Ring().Table()
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint(prefix, i)
		if o, _ := tbl.Owner(ring.Hash(LimitName, k)); o.Name == owner {
			keys = append(keys, k)
		}
	}
	return keys
}

// Member returns the member named name, or nil.
func (c *Cluster) Member(name string) *Member { return c.members[name] }

// Up returns the names of the members that are up, in the order of their
// first Add.
func (c *Cluster) Up() []string {
	var up []string
	for _, name := range c.order {
		if c.members[name].State == Up {
			up = append(up, name)
		}
	}
	return up
}

// Add starts a new node named name that joins the members that are up (it
// is the first node when none is). It does not wait for the join: Settle
// does.
func (c *Cluster) Add(name string) error {
	m, err := c.newMember(name, nil)
	if err != nil {
		return err
	}
	if err := c.start(m, c.config(m)); err != nil {
		return err
	}
	c.members[name] = m
	c.order = append(c.order, name)
	return nil
}

// AddMany starts new nodes named names all at once, each joining the
// members that were up before the call (Options.Configure may narrow each
// node's seeds), and adds those that started, in the order given; with no
// member up, the first name starts alone first and the others join it.
// It is Add for many nodes without Add's wait for each: a node's Start
// waits until its ready flag has been gossiped (up to the node's
// LeaveTimeout), which takes longer the larger the cluster, so starting a
// large cluster one node at a time costs simulated time that grows with
// the square of its size. It does not wait for the joins: Settle does.
func (c *Cluster) AddMany(names ...string) error {
	if len(names) > 0 && len(c.Up()) == 0 {
		if err := c.Add(names[0]); err != nil {
			return err
		}
		names = names[1:]
	}
	ms := make([]*Member, len(names))
	cfgs := make([]cluster.Config, len(names))
	taken := map[string]bool{}
	for i, name := range names {
		m, err := c.newMember(name, taken)
		if err != nil {
			return err
		}
		taken[name] = true
		ms[i], cfgs[i] = m, c.config(m)
	}
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = c.start(m, cfgs[i]) })
	}
	wg.Wait()
	for i, m := range ms {
		if errs[i] == nil {
			c.members[m.Name] = m
			c.order = append(c.order, m.Name)
		}
	}
	return errors.Join(errs...)
}

// newMember returns a new member named name at fresh addresses, or why
// the name cannot be used (taken: names being added with it).
func (c *Cluster) newMember(name string, taken map[string]bool) (*Member, error) {
	if _, ok := c.members[name]; ok || taken[name] {
		return nil, fmt.Errorf("add %s: a member of that name exists (restart it)", name)
	}
	if name == "" || strings.ContainsAny(name, " ,/") {
		return nil, fmt.Errorf("add %q: a name is non-empty, without spaces, commas or slashes", name)
	}
	return &Member{Name: name, GossipAddr: c.Gossip.NewAddr(), PeerAddr: PeerAddr(name), Store: writeback.NewMemStore(),
		OverridesFile: filepath.Join(c.dir, name+".overrides")}, nil
}

// PeerAddr is the address of the member named name on the peer network
// (Member.PeerAddr, its Config.GRPCAddr), known before the member is
// added: what another node's Config.RegionPeers names it by.
func PeerAddr(name string) string { return "peer-" + name }

// Restart starts again a member that left or crashed, at the same
// addresses, on a copy of its store (for a crash, what was flushed before
// it), joining the members that are up.
func (c *Cluster) Restart(name string) error {
	m := c.members[name]
	switch {
	case m == nil:
		return fmt.Errorf("restart %s: no such member", name)
	case m.State == Up:
		return fmt.Errorf("restart %s: it is up", name)
	}
	m.Store = m.Store.Clone()
	return c.start(m, c.config(m))
}

// start starts m's node with cfg (c.config(m)). It may run on a goroutine
// of its own (AddMany): it touches m and the networks only.
func (c *Cluster) start(m *Member, cfg cluster.Config) error {
	// Each process starts at a moment of its own, which its memberlist
	// timers keep: timers of two nodes that fire together would run their
	// goroutines in no fixed order.
	time.Sleep(c.Gossip.Hold(time.Now(), []byte(m.Name), binary.LittleEndian.AppendUint64(nil, cfg.BootID)))
	var peers cluster.Peers = countingPeers{memPeers: c.Peers.Peers(m.PeerAddr).(memPeers), c: c}
	if c.opts.Peers != nil {
		peers = c.opts.Peers(m.Name, peers)
	}
	n, err := cluster.New(cfg, peers)
	if err != nil {
		return fmt.Errorf("start %s: %w", m.Name, err)
	}
	c.Peers.Register(m.PeerAddr, n)
	if err := n.Start(context.Background()); err != nil {
		c.Peers.Crash(m.PeerAddr)
		n.Shutdown(context.Background())
		return fmt.Errorf("start %s: %w", m.Name, err)
	}
	m.Node, m.State = n, Up
	return nil
}

// config is the node config of m.
func (c *Cluster) config(m *Member) cluster.Config {
	cfg := cluster.DefaultConfig()
	ml := cluster.MemberlistConfig(true)
	ml.Name = m.Name
	ml.Transport = c.Gossip.Transport(m.GossipAddr)
	ml.LogOutput = io.Discard
	// A probe interval that is not a multiple of the gossip interval:
	// with 400 ms and 100 ms, every fourth gossip round would start at
	// the moment of a probe, and both draw from math/rand's one source
	// in whatever order their goroutines run.
	ml.GossipInterval += 37 * time.Microsecond
	ml.ProbeInterval += 113 * time.Microsecond
	cfg.Config = ml
	// Fewer partitions and points than the defaults: a rebuild of the
	// default ring (7919 partitions) costs milliseconds, and a run
	// rebuilds hundreds of times. Keys still move on every change.
	cfg.Ring.Partitions = Partitions
	cfg.Ring.VirtualNodes = VirtualNodes
	cfg.ClusterName = "clustertest"
	cfg.GRPCAddr = m.PeerAddr
	cfg.Store = m.Store
	cfg.OverridesFile = m.OverridesFile
	cfg.JoinRetry = 100 * time.Millisecond
	c.boots++
	cfg.BootID = c.opts.Seed<<24 ^ uint64(c.boots)<<1 // the low bit is set by the node
	cfg.Log = c.opts.Log
	cfg.Resolve = func(host string) ([]string, error) {
		return nil, fmt.Errorf("clustertest: no resolver (%s)", host)
	}
	for _, name := range c.order {
		if o := c.members[name]; o != m && o.State == Up {
			cfg.Join = append(cfg.Join, o.GossipAddr)
		}
	}
	if c.opts.Configure != nil {
		c.opts.Configure(&cfg)
	}
	// Each region is a gossip pool of its own: a node joins only members
	// of its region.
	m.Region = cfg.Region
	cfg.Join = slices.DeleteFunc(cfg.Join, func(addr string) bool {
		for _, o := range c.members {
			if o.GossipAddr == addr {
				return o.Region != m.Region
			}
		}
		return false
	})
	return cfg
}

// up returns the member named name when it is up.
func (c *Cluster) up(op, name string) (*Member, error) {
	m := c.members[name]
	switch {
	case m == nil:
		return nil, fmt.Errorf("%s %s: no such member", op, name)
	case m.State != Up:
		return nil, fmt.Errorf("%s %s: it is not up", op, name)
	}
	return m, nil
}

// Leave makes the member leave gracefully (cluster.Node.Leave, then
// Shutdown) and returns Leave's error (counters not handed off).
func (c *Cluster) Leave(name string) error {
	m, err := c.up("leave", name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lerr := m.Node.Leave(ctx)
	serr := m.Node.Shutdown(ctx)
	m.Node, m.State = nil, Left
	c.Peers.Unregister(m.PeerAddr)
	if lerr != nil {
		return fmt.Errorf("leave %s: %w", name, lerr)
	}
	if serr != nil {
		return fmt.Errorf("leave %s: shutdown: %w", name, serr)
	}
	return nil
}

// Crash kills the member: from now on nothing it sends arrives and nothing
// reaches it, and its store is what it flushed until now. Its goroutines
// are stopped in the background (their effects reach nobody).
func (c *Cluster) Crash(name string) error {
	m, err := c.up("crash", name)
	if err != nil {
		return err
	}
	disk := m.Store.Clone()
	c.Gossip.Crash(m.GossipAddr)
	c.Peers.Crash(m.PeerAddr)
	zombie := m.Node
	c.zombies.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		zombie.Shutdown(ctx)
	})
	m.Node, m.State, m.Store = nil, Crashed, disk
	return nil
}

// Partition cuts gossip and peer calls between the groups, both ways;
// every member that is up must be in exactly one group. Members added
// later reach everyone. Heal undoes it.
func (c *Cluster) Partition(groups ...[]string) error {
	in := map[string]int{}
	for i, g := range groups {
		for _, name := range g {
			if _, err := c.up("partition", name); err != nil {
				return err
			}
			if _, dup := in[name]; dup {
				return fmt.Errorf("partition: %s is in two groups", name)
			}
			in[name] = i
		}
	}
	for _, name := range c.Up() {
		if _, ok := in[name]; !ok {
			return fmt.Errorf("partition: %s is up but in no group", name)
		}
	}
	var peerGroups [][]string
	for _, g := range groups {
		var pg []string
		for _, a := range g {
			pg = append(pg, c.members[a].PeerAddr)
			for _, b := range c.Up() {
				if in[b] != in[a] {
					c.Gossip.Cut(c.members[a].GossipAddr, c.members[b].GossipAddr)
				}
			}
		}
		peerGroups = append(peerGroups, pg)
	}
	c.Peers.Partition(cluster.Blackhole, peerGroups...)
	c.groups = in
	return nil
}

// Heal removes every partition, drop and delay.
func (c *Cluster) Heal() {
	c.Gossip.Heal()
	c.Peers.Heal()
	c.Peers.SetDelay(0)
	c.groups, c.drops = nil, false
}

// Drop loses everything from sends to: gossip packets vanish and peer
// calls hang until their deadline.
func (c *Cluster) Drop(from, to string) error {
	a, err := c.up("drop", from)
	if err != nil {
		return err
	}
	b, err := c.up("drop", to)
	if err != nil {
		return err
	}
	c.Gossip.Cut(a.GossipAddr, b.GossipAddr)
	c.Peers.Cut(a.PeerAddr, b.PeerAddr, cluster.Blackhole)
	c.drops = true
	return nil
}

// Delay delays every peer call by d (0: none).
func (c *Cluster) Delay(d time.Duration) { c.Peers.SetDelay(d) }

// Request is the request Check sends.
func Request(key string, limit, hits int64) check.Request {
	return check.Request{Name: LimitName, Key: key, Hits: hits,
		Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: limit, WindowMS: Window.Milliseconds()}}
}

// Check sends hits against key (limit per Window) through the member via
// and returns the answer; an answer with Err, or none within CheckTimeout,
// is an error.
func (c *Cluster) Check(via, key string, limit, hits int64) (check.Outcome, error) {
	m, err := c.up("check via", via)
	if err != nil {
		return check.Outcome{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), CheckTimeout)
	defer cancel()
	reqs := []check.Request{Request(key, limit, hits)}
	out := make([]check.Outcome, 1)
	m.Node.Check(ctx, reqs, out)
	if out[0].Err != "" {
		return out[0], fmt.Errorf("check %s via %s: %s", key, via, out[0].Err)
	}
	if ctx.Err() != nil {
		return out[0], fmt.Errorf("check %s via %s: not answered within %v", key, via, CheckTimeout)
	}
	return out[0], nil
}

// FailedForwards returns how many forwarded items of key failed or timed
// out (Forward and ForwardStandIn calls that returned an error), over every
// node: each may have been decided again by a stand-in.
func (c *Cluster) FailedForwards(key string) int64 {
	c.failedMu.Lock()
	defer c.failedMu.Unlock()
	return c.failed[key]
}

// memPeers is what cluster.MemNetwork.Peers returns: the peer calls, and
// those a node makes only when its Peers has them (lease returns, the
// questions after a pause, region slices).
type memPeers interface {
	cluster.Peers
	cluster.ReturnPeers
	cluster.DecidedPeers
	cluster.RegionPeers
}

// countingPeers counts, per key, the items of forwards that failed. It
// passes every other call on, the optional ones included: embedding
// cluster.Peers alone would hide them from the node, which would then
// return no lease, ask nothing after a pause and lend no region slice.
type countingPeers struct {
	memPeers
	c *Cluster
}

func (p countingPeers) Forward(ctx context.Context, addr string, reqs []check.Request, out []check.Outcome, movedTo []string) error {
	return p.count(reqs, p.memPeers.Forward(ctx, addr, reqs, out, movedTo))
}

func (p countingPeers) ForwardStandIn(ctx context.Context, addr string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
	return p.count(reqs, p.memPeers.ForwardStandIn(ctx, addr, reqs, pullFrom, out, movedTo))
}

func (p countingPeers) count(reqs []check.Request, err error) error {
	if err != nil {
		p.c.failedMu.Lock()
		for _, r := range reqs {
			p.c.failed[r.Key]++
		}
		p.c.failedMu.Unlock()
	}
	return err
}

// Settle lets the bubble's time run until every member that is up is
// ready and its ring holds exactly the members that are up, on its side
// of a partition and in its region; it fails after SettleTimeout. It must be called from the
// bubble's main goroutine; it cannot settle one-way drops.
func (c *Cluster) Settle() error {
	if c.drops {
		return fmt.Errorf("settle: one-way drops have no settled state (heal first)")
	}
	deadline := time.Now().Add(SettleTimeout)
	for {
		synctest.Wait()
		if c.settled() == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("settle: not settled after %v: %s", SettleTimeout, c.settled())
		}
		time.Sleep(settleStep)
	}
}

// settled returns "" when every member is settled, else the first that is
// not and what it sees. It sorts the names up once per look, not once per
// member, so that a look at a thousand members stays cheap.
func (c *Cluster) settled() string {
	up := c.Up()
	want := map[side][]string{} // one side when whole and without regions
	for _, o := range up {
		want[c.side(o)] = append(want[c.side(o)], o)
	}
	for _, w := range want {
		sort.Strings(w)
	}
	for _, name := range up {
		n := c.members[name].Node
		if !n.Ready() {
			return name + " is not ready"
		}
		w := want[c.side(name)]
		have := n.Ring().Table().Members() // sorted by name
		if !slices.EqualFunc(have, w, func(m ring.Member, s string) bool { return m.Name == s }) {
			return fmt.Sprintf("%s's ring %s", name, ringDiff(have, w))
		}
	}
	// Every ring is as it should be. A member that crashed or left may
	// still be news on its way, though: known alive, not yet ready, it is
	// in no ring until its ready flag arrives, and a leave then hands keys
	// to it. Settled means no member sees one that is not up in its group
	// as alive or suspect.
	for _, name := range up {
		for _, ms := range c.members[name].Node.Status().Members {
			if ms.State != cluster.StateAlive && ms.State != cluster.StateSuspect {
				continue
			}
			if o := c.members[ms.Name]; o == nil || o.State != Up || c.side(o.Name) != c.side(name) {
				return fmt.Sprintf("%s sees %s %s", name, ms.Name, ms.State)
			}
		}
	}
	return ""
}

// side is where a member's ring ends: its group of a partition and its
// region.
type side struct {
	group  int
	region string
}

// side returns the side of the member named name.
func (c *Cluster) side(name string) side {
	return side{c.groups[name], c.members[name].Region}
}

// ringDiff says how a ring's members (sorted by name) differ from want
// (sorted): both in full for a small cluster, else the names missing and
// those in excess.
func ringDiff(have []ring.Member, want []string) string {
	names := make([]string, len(have))
	for i, m := range have {
		names[i] = m.Name
	}
	if len(names) <= 10 && len(want) <= 10 {
		return fmt.Sprintf("holds %v, want %v", names, want)
	}
	var missing, extra []string
	for i, j := 0, 0; i < len(names) || j < len(want); {
		switch {
		case j == len(want) || i < len(names) && names[i] < want[j]:
			extra = append(extra, names[i])
			i++
		case i == len(names) || want[j] < names[i]:
			missing = append(missing, want[j])
			j++
		default:
			i++
			j++
		}
	}
	return fmt.Sprintf("holds %d members, want %d: missing %v, not up or on another side %v", len(names), len(want), missing, extra)
}

// Close stops every node (gracefully for those up) and waits for the
// crashed ones to stop. New registers it with t.Cleanup.
func (c *Cluster) Close() {
	c.Heal()
	var wg sync.WaitGroup
	for _, name := range c.Up() {
		m := c.members[name]
		n := m.Node
		m.Node, m.State = nil, Left
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			n.Shutdown(ctx)
		})
	}
	wg.Wait()
	c.zombies.Wait()
	// memberlist's Shutdown does not wait for a probe in progress: let
	// the bubble's time run past the longest (the probe interval and
	// timeouts), or the bubble would end with it still blocked.
	time.Sleep(closeGrace)
}

// closeGrace is how long Close lets time run once every node stopped.
const closeGrace = 10 * time.Second
