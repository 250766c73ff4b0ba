package main

// The metrics of this node's calls to its peers (sluice_peer_rpc_*): the
// cluster's Peers wrapped so that every call is timed and its failures
// counted, by call and peer.

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
)

// peerRPC names a call to a peer, for sluice_peer_rpc_*{rpc}.
type peerRPC uint8

const (
	rpcForward peerRPC = iota
	rpcStandIn
	rpcReplicate
	rpcHandoff
	rpcPull
	rpcReturn
	rpcRegionGrant
	rpcDecided
	numPeerRPCs
)

var peerRPCNames = [numPeerRPCs]string{"forward", "stand_in", "replicate", "handoff", "pull", "return", "region_grant", "decided"}

// peerMetrics times the calls this node makes to its peers, by call and
// peer gRPC address. The handles of an address are resolved the first
// time it is called and dropped (series deleted) at a scrape once the
// address is no longer any known member's, so the series follow the
// cluster's membership.
type peerMetrics struct {
	dur    *prometheus.HistogramVec
	errs   *prometheus.CounterVec
	mu     sync.Mutex // serialises changes to byAddr
	byAddr atomic.Pointer[map[string]*peerHandles]
}

type peerHandles struct {
	dur  [numPeerRPCs]prometheus.Observer
	errs [numPeerRPCs]prometheus.Counter
}

func newPeerMetrics() *peerMetrics {
	p := &peerMetrics{
		dur: prometheus.NewHistogramVec(latencyOpts("sluice_peer_rpc_duration_seconds",
			"Time this node waited for a peer's answer, by call (forward, stand_in, replicate, handoff, pull) and peer gRPC address; a forward's includes waiting for its batch."),
			[]string{"rpc", "peer"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_peer_rpc_errors_total",
			Help: "Calls to a peer that failed (unreachable, timed out, refused), by call and peer gRPC address.",
		}, []string{"rpc", "peer"}),
	}
	p.byAddr.Store(&map[string]*peerHandles{})
	return p
}

func (p *peerMetrics) observe(rpc peerRPC, addr string, start time.Time, err error) {
	h := (*p.byAddr.Load())[addr]
	if h == nil {
		h = p.add(addr)
	}
	h.dur[rpc].Observe(time.Since(start).Seconds())
	if err != nil {
		h.errs[rpc].Inc()
	}
}

func (p *peerMetrics) add(addr string) *peerHandles {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h := (*p.byAddr.Load())[addr]; h != nil {
		return h
	}
	h := &peerHandles{}
	for r := range numPeerRPCs {
		h.dur[r] = p.dur.WithLabelValues(peerRPCNames[r], addr)
		h.errs[r] = p.errs.WithLabelValues(peerRPCNames[r], addr)
	}
	next := maps.Clone(*p.byAddr.Load())
	next[addr] = h
	p.byAddr.Store(&next)
	return h
}

// prune drops the series of addresses that no member has any more (a
// restarted pod's old address). An observation racing with it is lost.
func (p *peerMetrics) prune(known map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := *p.byAddr.Load()
	var next map[string]*peerHandles
	for addr := range cur {
		if known[addr] {
			continue
		}
		if next == nil {
			next = maps.Clone(cur)
		}
		delete(next, addr)
		p.dur.DeletePartialMatch(prometheus.Labels{"peer": addr})
		p.errs.DeletePartialMatch(prometheus.Labels{"peer": addr})
	}
	if next != nil {
		p.byAddr.Store(&next)
	}
}

// observedPeers is the cluster's Peers with every call timed and its
// errors counted per peer.
type observedPeers struct {
	next cluster.Peers
	m    *peerMetrics
}

var (
	_ cluster.Peers        = observedPeers{}
	_ cluster.PeerWaker    = observedPeers{}
	_ cluster.DecidedPeers = observedPeers{}
)

// ResetBackoff passes the node's wake-up for a returning member on to the
// peer client, when it keeps connections (cluster.PeerWaker).
func (o observedPeers) ResetBackoff(addr string) {
	if w, ok := o.next.(cluster.PeerWaker); ok {
		w.ResetBackoff(addr)
	}
}

func (o observedPeers) Forward(ctx context.Context, addr string, reqs []check.Request, out []check.Outcome, movedTo []string) error {
	start := time.Now()
	err := o.next.Forward(ctx, addr, reqs, out, movedTo)
	o.m.observe(rpcForward, addr, start, err)
	return err
}

func (o observedPeers) ForwardStandIn(ctx context.Context, addr string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
	start := time.Now()
	err := o.next.ForwardStandIn(ctx, addr, reqs, pullFrom, out, movedTo)
	o.m.observe(rpcStandIn, addr, start, err)
	return err
}

func (o observedPeers) Replicate(ctx context.Context, addr string, handoff bool, counters []bucket.Counter) (int, int, error) {
	start := time.Now()
	installed, stale, err := o.next.Replicate(ctx, addr, handoff, counters)
	rpc := rpcReplicate
	if handoff {
		rpc = rpcHandoff
	}
	o.m.observe(rpc, addr, start, err)
	return installed, stale, err
}

func (o observedPeers) Pull(ctx context.Context, addr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) error {
	start := time.Now()
	err := o.next.Pull(ctx, addr, keys, release, ttl, ans)
	o.m.observe(rpcPull, addr, start, err)
	return err
}

// Return passes lease returns on when the transport carries them.
func (o observedPeers) Return(ctx context.Context, addr string, rets []check.LeaseReturn) ([]int64, error) {
	rp, ok := o.next.(cluster.ReturnPeers)
	if !ok {
		return nil, cluster.ErrNoPeers
	}
	start := time.Now()
	taken, err := rp.Return(ctx, addr, rets)
	o.m.observe(rpcReturn, addr, start, err)
	return taken, err
}

// RegionGrant passes region asks on when the transport carries them.
func (o observedPeers) RegionGrant(ctx context.Context, addr string, q *check.RegionQuery, ans []check.RegionAnswer) (string, error) {
	rp, ok := o.next.(cluster.RegionPeers)
	if !ok {
		return "", cluster.ErrNoPeers
	}
	start := time.Now()
	region, err := rp.RegionGrant(ctx, addr, q, ans)
	o.m.observe(rpcRegionGrant, addr, start, err)
	return region, err
}

// Decided passes a paused node's question to a member on when the
// transport carries it.
func (o observedPeers) Decided(ctx context.Context, addr string, within time.Duration, count int, parts []uint32) (keymove.DecidedAnswer, error) {
	dp, ok := o.next.(cluster.DecidedPeers)
	if !ok {
		return keymove.DecidedAnswer{}, cluster.ErrNoPeers
	}
	start := time.Now()
	a, err := dp.Decided(ctx, addr, within, count, parts)
	o.m.observe(rpcDecided, addr, start, err)
	return a, err
}
