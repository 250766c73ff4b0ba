package cluster

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
)

// ForwardHandler is the receiving side of the peer calls: Node implements it.
type ForwardHandler interface {
	CheckForwarded(ctx context.Context, from string, reqs []check.Request, out []check.Outcome, movedTo []string)
	CheckStandIn(ctx context.Context, from string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string)
	Replicate(ctx context.Context, from string, handoff bool, counters []bucket.Counter) (installed, stale int)
	Pull(ctx context.Context, from, fromAddr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer)
}

// MemNetwork connects nodes in one process without sockets, with failure
// controls for tests: a link can be cut so that forwards fail at once
// (Refuse) or hang until their deadline (Blackhole), and every forward can
// be delayed. Sends never block past the caller's context. Safe for
// concurrent use.
type MemNetwork struct {
	mu     sync.Mutex
	nodes  map[string]ForwardHandler // by gRPC address
	faults map[[2]string]Fault       // by (from, to) address
	gen    map[string]int            // by address: bumped by Crash; a Peers of an older one is dead
	delay  time.Duration
	calls  int
	pulls  map[string]int // Pull calls by sender address

	// Seeded delivery (SeedDelivery): each call is held for a time of
	// [0, spread) fixed by seed and by the call.
	seed   uint64
	spread time.Duration
	// deliveries, when recording (RecordDeliveries), is every call in
	// the order it reached its receiver.
	recording  bool
	deliveries []string
}

// Fault is how a cut link fails.
type Fault uint8

const (
	// Refuse fails the forward at once, like a closed port.
	Refuse Fault = iota + 1
	// Blackhole never answers: the forward fails when its context ends.
	Blackhole
	// SlowPulls makes every Pull over the link fail as one not answered
	// within its deadline would (context.DeadlineExceeded), at once; the
	// other calls pass. It stands for a loaded machine, where a pull
	// (PullTimeout) runs out before a forward (ForwardTimeout) does.
	SlowPulls
	// Late delivers every call once the caller's context has ended: the
	// receiver handles it with that context done, as a node whose queue
	// held the call past its deadline does, and the caller gets the
	// context's error.
	Late
)

// ErrUnreachable is returned by a forward over a refused link or to an
// address nobody registered.
var ErrUnreachable = errors.New("memnet: peer unreachable")

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{nodes: make(map[string]ForwardHandler), faults: make(map[[2]string]Fault),
		gen: make(map[string]int), pulls: make(map[string]int)}
}

// Register makes h reachable at addr.
func (m *MemNetwork) Register(addr string, h ForwardHandler) {
	m.mu.Lock()
	m.nodes[addr] = h
	m.mu.Unlock()
}

// Unregister makes addr unreachable, as if its process died.
func (m *MemNetwork) Unregister(addr string) {
	m.mu.Lock()
	delete(m.nodes, addr)
	m.mu.Unlock()
}

// Crash takes the node at addr off the network as its process dies: calls
// to addr fail at once (a closed port) until a node registers there again,
// and every call made through a Peers that Peers(addr) returned before the
// crash fails too, even once a restarted node holds the address: the
// crashed node's goroutines may run on until the test stops them, and
// nothing they send must arrive.
func (m *MemNetwork) Crash(addr string) {
	m.mu.Lock()
	delete(m.nodes, addr)
	m.gen[addr]++
	m.mu.Unlock()
}

// Cut makes forwards from → to fail with f; Cut(a, b, 0) heals the link.
func (m *MemNetwork) Cut(from, to string, f Fault) {
	m.mu.Lock()
	if f == 0 {
		delete(m.faults, [2]string{from, to})
	} else {
		m.faults[[2]string{from, to}] = f
	}
	m.mu.Unlock()
}

// Partition cuts, both ways and with f, every link between a node of one
// group and a node of another.
func (m *MemNetwork) Partition(f Fault, groups ...[]string) {
	for i, g := range groups {
		for j, h := range groups {
			if i == j {
				continue
			}
			for _, a := range g {
				for _, b := range h {
					m.Cut(a, b, f)
				}
			}
		}
	}
}

// Heal removes every fault.
func (m *MemNetwork) Heal() {
	m.mu.Lock()
	clear(m.faults)
	m.mu.Unlock()
}

// SeedDelivery makes the order in which calls reach their receivers a
// function of seed: each call is held, on top of SetDelay's delay, for a
// time in [0, spread) that hashes seed with the call itself (sender,
// receiver, kind, the keys it carries, in any order, and the clock when
// it is sent), not with the order in which goroutines happened to make
// the calls. In a testing/synctest bubble, where time moves only when
// every goroutine is blocked and timers fire in the order of their times,
// two calls sent at the same moment then reach their receivers in an
// order the seed fixes, one after the other, each handled before the next
// arrives; a run whose steps the seed fixes too replays. spread 0 turns
// it off.
func (m *MemNetwork) SeedDelivery(seed uint64, spread time.Duration) {
	m.mu.Lock()
	m.seed, m.spread = seed, spread
	m.mu.Unlock()
}

// RecordDeliveries starts recording every call as it reaches its receiver
// (Deliveries).
func (m *MemNetwork) RecordDeliveries() {
	m.mu.Lock()
	m.recording = true
	m.mu.Unlock()
}

// Deliveries returns the calls recorded since RecordDeliveries, in the
// order they reached their receivers: the clock (Unix ns), sender,
// receiver, kind and the digest of what each carried.
func (m *MemNetwork) Deliveries() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.deliveries...)
}

// call is what reach knows of a call: its kind and a digest of what it
// carries, the same whatever the order of its items (digest).
type call struct {
	kind   string
	digest uint64
}

// digest sums the hashes of n items: a batch's digest does not depend on
// the order in which the sender collected its items.
func digest(n int, item func(i int) string) uint64 {
	var d uint64
	for i := range n {
		h := fnv.New64a()
		h.Write([]byte(item(i)))
		d += h.Sum64()
	}
	return d
}

func reqsCall(kind string, reqs []check.Request) call {
	return call{kind, digest(len(reqs), func(i int) string {
		return reqs[i].Name + "\x00" + reqs[i].Key + "\x00" + strconv.FormatInt(reqs[i].Hits, 10)
	})}
}

func countersCall(kind string, cs []bucket.Counter) call {
	return call{kind, digest(len(cs), func(i int) string {
		return cs[i].Name + "\x00" + cs[i].Key + "\x00" + strconv.FormatUint(cs[i].Version, 10)
	})}
}

// hold returns how long seeded delivery holds c from → to, sent at now.
func (m *MemNetwork) hold(from, to string, c call, now time.Time) time.Duration {
	if m.spread <= 0 {
		return 0
	}
	var b [8]byte
	h := fnv.New64a()
	for _, v := range []uint64{m.seed, c.digest, uint64(now.UnixNano())} {
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		h.Write(b[:])
	}
	h.Write([]byte(from + "\x00" + to + "\x00" + c.kind))
	return time.Duration(h.Sum64() % uint64(m.spread))
}

// SetDelay delays every forward by d (0: none).
func (m *MemNetwork) SetDelay(d time.Duration) {
	m.mu.Lock()
	m.delay = d
	m.mu.Unlock()
}

// Calls returns the number of forwards tried so far.
func (m *MemNetwork) Calls() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// Pulls returns the number of Pull calls the node at address from tried.
func (m *MemNetwork) Pulls(from string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pulls[from]
}

// Peers returns the Peers of the node at address from.
func (m *MemNetwork) Peers(from string) Peers {
	m.mu.Lock()
	defer m.mu.Unlock()
	return memPeers{m: m, from: from, gen: m.gen[from]}
}

type memPeers struct {
	m    *MemNetwork
	from string
	gen  int // m.gen[from] when made: the sender crashed once it differs
}

var _ Peers = memPeers{}

func (p memPeers) Forward(ctx context.Context, addr string, reqs []check.Request, out []check.Outcome, movedTo []string) error {
	return p.forward(ctx, addr, false, reqs, nil, out, movedTo)
}

func (p memPeers) ForwardStandIn(ctx context.Context, addr string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
	return p.forward(ctx, addr, true, reqs, pullFrom, out, movedTo)
}

func (p memPeers) forward(ctx context.Context, addr string, standIn bool, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
	p.m.mu.Lock()
	p.m.calls++
	p.m.mu.Unlock()
	c := reqsCall("forward", reqs)
	if standIn {
		c = reqsCall("stand-in", reqs)
	}
	h, err := p.reach(ctx, addr, c)
	if err != nil {
		return err
	}
	if standIn {
		h.CheckStandIn(ctx, p.from, reqs, pullFrom, out, movedTo)
	} else if lh, ok := h.(interface {
		CheckForwardedLeasing(context.Context, string, []check.Request, []check.Outcome, []string)
	}); ok {
		// As a Sluice peer client's forward does: the sender takes leases.
		lh.CheckForwardedLeasing(ctx, p.from, reqs, out, movedTo)
	} else {
		h.CheckForwarded(ctx, p.from, reqs, out, movedTo)
	}
	// An answer ready after the caller's deadline does not reach it: the
	// call failed, as a gRPC call does (DeadlineExceeded).
	return ctx.Err()
}

func (p memPeers) Replicate(ctx context.Context, addr string, handoff bool, counters []bucket.Counter) (int, int, error) {
	kind := "replicate"
	if handoff {
		kind = "handoff"
	}
	h, err := p.reach(ctx, addr, countersCall(kind, counters))
	if err != nil {
		return 0, 0, err
	}
	in, st := h.Replicate(ctx, p.from, handoff, counters)
	if err := ctx.Err(); err != nil {
		return 0, 0, err // answered too late: see forward
	}
	return in, st, nil
}

func (p memPeers) Pull(ctx context.Context, addr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) error {
	p.m.mu.Lock()
	p.m.pulls[p.from]++
	slow := p.m.faults[[2]string{p.from, addr}] == SlowPulls
	p.m.mu.Unlock()
	if slow {
		return fmt.Errorf("memnet: pull %s → %s: %w", p.from, addr, context.DeadlineExceeded)
	}
	kind := "pull"
	if release {
		kind = "pull-release"
	}
	h, err := p.reach(ctx, addr, countersCall(kind, keys))
	if err != nil {
		return err
	}
	h.Pull(ctx, p.from, p.from, keys, release, ttl, ans)
	return ctx.Err() // answered too late: see forward
}

// Return passes lease returns to the node at addr, when it takes them.
func (p memPeers) Return(ctx context.Context, addr string, rets []check.LeaseReturn) ([]int64, error) {
	h, err := p.reach(ctx, addr, call{"return", digest(len(rets), func(i int) string {
		r := rets[i]
		return r.Request.Name + "\x00" + r.Request.Key + "\x00" + strconv.FormatInt(r.Request.Hits, 10) + "\x00" + strconv.FormatInt(r.GrantedAt, 10)
	})})
	if err != nil {
		return nil, err
	}
	lr, ok := h.(interface {
		ReturnLeases(ctx context.Context, from string, rets []check.LeaseReturn, taken []int64)
	})
	if !ok {
		return nil, fmt.Errorf("%w: %s takes no lease returns", ErrUnreachable, addr)
	}
	taken := make([]int64, len(rets))
	lr.ReturnLeases(ctx, p.from, rets, taken)
	return taken, ctx.Err()
}

// Decided asks the node at addr which keys it decided lately, when it
// records them.
func (p memPeers) Decided(ctx context.Context, addr string, within time.Duration, count int, parts []uint32) (keymove.DecidedAnswer, error) {
	h, err := p.reach(ctx, addr, call{"decided", digest(len(parts), func(i int) string { return strconv.FormatUint(uint64(parts[i]), 10) })})
	if err != nil {
		return keymove.DecidedAnswer{}, err
	}
	d, ok := h.(interface {
		Decided(ctx context.Context, from string, within time.Duration, count int, parts []uint32) keymove.DecidedAnswer
	})
	if !ok {
		return keymove.DecidedAnswer{}, fmt.Errorf("%w: %s records no decisions", ErrUnreachable, addr)
	}
	// The question names its sender by node name, as Peer/Decided does
	// (the other calls here name it by address).
	from := p.from
	p.m.mu.Lock()
	if named, ok := p.m.nodes[p.from].(interface{ Name() string }); ok {
		from = named.Name()
	}
	p.m.mu.Unlock()
	a := d.Decided(ctx, from, within, count, parts)
	return a, ctx.Err()
}

// RegionGrant passes a region's asks to the node at addr, when it lends.
func (p memPeers) RegionGrant(ctx context.Context, addr string, q *check.RegionQuery, ans []check.RegionAnswer) (string, error) {
	h, err := p.reach(ctx, addr, call{"region", digest(len(q.Asks), func(i int) string {
		a := q.Asks[i]
		return a.Request.Name + "\x00" + a.Request.Key + "\x00" + strconv.FormatInt(a.Request.Hits, 10)
	})})
	if err != nil {
		return "", err
	}
	g, ok := h.(interface {
		GrantRegion(ctx context.Context, q *check.RegionQuery, ans []check.RegionAnswer) string
	})
	if !ok {
		return "", fmt.Errorf("%w: %s lends no region slices", ErrUnreachable, addr)
	}
	got := make([]check.RegionAnswer, len(ans))
	region := g.GrantRegion(ctx, q, got)
	if err := ctx.Err(); err != nil {
		return "", err
	}
	copy(ans, got)
	return region, nil
}

// reach applies the link's delay and fault and returns the handler at addr
// for call c.
func (p memPeers) reach(ctx context.Context, addr string, c call) (ForwardHandler, error) {
	p.m.mu.Lock()
	h, ok := p.m.nodes[addr]
	fault := p.m.faults[[2]string{p.from, addr}]
	crashed := p.m.gen[p.from] != p.gen
	delay := p.m.delay + p.m.hold(p.from, addr, c, time.Now())
	p.m.mu.Unlock()
	if crashed {
		return nil, fmt.Errorf("%w: %s → %s (crashed)", ErrUnreachable, p.from, addr)
	}
	defer p.m.delivered(p.from, addr, c)
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	switch {
	case fault == Blackhole:
		<-ctx.Done()
		return nil, ctx.Err()
	case fault == Late && ok:
		<-ctx.Done()
		return h, nil
	case fault == Refuse || !ok:
		return nil, fmt.Errorf("%w: %s → %s", ErrUnreachable, p.from, addr)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return h, nil
}

// delivered records c from → to as it reaches (or fails to reach) its
// receiver, when recording.
func (m *MemNetwork) delivered(from, to string, c call) {
	m.mu.Lock()
	if m.recording {
		m.deliveries = append(m.deliveries, fmt.Sprintf("%d %s→%s %s %016x", time.Now().UnixNano(), from, to, c.kind, c.digest))
	}
	m.mu.Unlock()
}
