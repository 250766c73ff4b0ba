package cluster

// Regions (docs/regions.md): each region is a ring of its own; a global
// limit's key has a home region, chosen by hash, whose owner of the key
// holds the count. The owner of the key in every other region decides its
// region's checks from slices the home lends it (the quota leases of
// docs/leases.md, between regions), asked for in the background, so no
// check waits on another region. Cut off from the home, a region decides
// from what it holds, then from a fallback share of the limit.

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/lease"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// RegionPeers is a Peers that also carries region grants
// (Peer/RegionGrant). Without it a node with a region lends and asks
// nothing: global keys homed elsewhere are decided from the fallback share.
type RegionPeers interface {
	RegionGrant(ctx context.Context, addr string, q *check.RegionQuery, ans []check.RegionAnswer) (region string, err error)
}

var regionName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// validateRegions checks a node's region and its peers' (--region,
// --region-join).
func validateRegions(region string, peers map[string][]string) error {
	if region == "" {
		return nil
	}
	if !regionName.MatchString(region) {
		return fmt.Errorf("cluster: region %q: want 1 to 32 of a-z, 0-9 and -, starting with a letter or digit", region)
	}
	for r, addrs := range peers {
		switch {
		case !regionName.MatchString(r):
			return fmt.Errorf("cluster: region-join: region %q: want 1 to 32 of a-z, 0-9 and -, starting with a letter or digit", r)
		case r == region:
			return fmt.Errorf("cluster: region-join names this node's own region %q: its nodes join with --join", r)
		case len(addrs) == 0:
			return fmt.Errorf("cluster: region-join: region %q has no address", r)
		}
		for _, a := range addrs {
			if a == "" || len(a) > maxAddrLen {
				return fmt.Errorf("cluster: region-join: region %q: bad address %q", r, a)
			}
		}
	}
	return nil
}

// fallbackSub is the cache sub-key (writeback.SubKey) of a global key's
// fallback counter: the share a region decides alone while cut off.
const fallbackSub = 30 // above any multi-limit index (at most 16 limits), within the cache's 31

// regions is a node's view of the regions.
type regions struct {
	self  string
	names []string // every region, sorted, self included
	share float64  // RegionFallbackShare, resolved
	// slices of global keys homed elsewhere, lent to this node as their
	// regional owner.
	table *lease.Table
	kick  chan struct{}

	// book: the slices this node lent other regions as a home owner,
	// for their returns; swept of those past any slice's life.
	book      *lease.Book
	lastSweep atomic.Int64

	mu     sync.Mutex
	demand map[lease.Key]*regionDemand
	links  map[string]*regionLink // by region
}

// regionDemand is how many hits of a key this node's region asked for, in
// the current sync period and the one before.
type regionDemand struct {
	home      string
	cur, prev int64
	idle      int // periods without demand
}

// regionLink is what this node knows of reaching one other region.
type regionLink struct {
	addrs    []string
	next     int   // the address to try first
	lastOK   int64 // Unix ns of the last answer (the node's start until one)
	lastFail int64 // Unix ns of the last failed call
	rtt      time.Duration
	answered bool // lastOK is an answer, not the node's start
	// Counts for Status.
	asks, grants, failures uint64
}

func newRegions(cfg *Config, now int64) *regions {
	if cfg.Region == "" {
		return nil
	}
	rs := &regions{self: cfg.Region, table: lease.NewTable(), kick: make(chan struct{}, 1), book: lease.NewBook(),
		demand: map[lease.Key]*regionDemand{}, links: map[string]*regionLink{}}
	rs.names = append(rs.names, cfg.Region)
	for r, addrs := range cfg.RegionPeers {
		rs.names = append(rs.names, r)
		rs.links[r] = &regionLink{addrs: slices.Clone(addrs), lastOK: now}
	}
	slices.Sort(rs.names)
	rs.share = cfg.RegionFallbackShare
	if rs.share == 0 {
		rs.share = 1 / float64(len(rs.names))
	}
	return rs
}

// home returns the home region of the key whose ring hash is h.
func (rs *regions) home(h uint64) string {
	x := h * 0x9e3779b97f4a7c15 // not the ring's partitioning of h
	return rs.names[(x>>32)%uint64(len(rs.names))]
}

// away reports whether a check against lims is of a global limit whose
// key (ring hash h) has its home in another region, and which.
func (n *Node) away(h uint64, lims limits) (string, bool) {
	if n.regions == nil || len(lims.more) > 0 || !lims.one.Global {
		return "", false
	}
	home := n.regions.home(h)
	return home, home != n.regions.self
}

// cut reports whether this node counts region r as cut off at now: a call
// failed since its last answer, and that answer is RegionCutAfter old.
func (n *Node) cut(r string, now int64) bool {
	rs := n.regions
	rs.mu.Lock()
	defer rs.mu.Unlock()
	l := rs.links[r]
	return l == nil || l.lastFail > l.lastOK && now-l.lastOK > int64(n.cfg.RegionCutAfter)
}

// decideAway decides hits of k against the global limit lim, homed in
// region home, on this node, its owner in this region: from the slices the
// home lent (the decision names this node); with none left, refused until
// the next slice can arrive — or, while the home is cut off, from the
// fallback counter, a share of the limit this region counts alone.
func (n *Node) decideAway(d *bucket.Decision, h uint64, k writeback.Key, lim *bucket.Limit, hits, now int64, home string) error {
	rs := n.regions
	lk := lease.Key{Name: k.Name, Key: k.Key, Limit: *lim}
	rs.note(lk, home, hits)
	if hits < 1 {
		// A peek: what this region holds.
		if left := rs.table.Left(lk, now); left > 0 {
			*d = bucket.Decision{Status: bucket.UnderLimit, Limit: lim.Limit, Remaining: left}
			return nil
		}
	} else if rs.table.Take(lk, hits, now, d) {
		return nil
	}
	if !n.cut(home, now) {
		*d = bucket.Decision{Status: bucket.OverLimit, Limit: lim.Limit, RetryAfterMS: n.regionRetryMS(home)}
		return nil
	}
	fb := *lim
	fb.Global = false
	fb.Limit = int64(math.Floor(rs.share * float64(lim.Limit)))
	if lim.Burst > 0 {
		fb.Burst = max(int64(math.Floor(rs.share*float64(lim.Burst))), fb.Limit)
	}
	n.stats.regionFallback.Add(1)
	err := n.cache.DecideTo(d, h, writeback.SubKey(k, fallbackSub), &fb, hits, now, n.Load())
	d.Limit = lim.Limit
	return err
}

// regionRetryMS is how long a check refused for want of a slice from home
// should wait: a sync period and a round trip.
func (n *Node) regionRetryMS(home string) int64 {
	rs := n.regions
	rs.mu.Lock()
	rtt := time.Duration(0)
	if l := rs.links[home]; l != nil {
		rtt = l.rtt
	}
	rs.mu.Unlock()
	return max((n.cfg.RegionSync + rtt).Milliseconds(), 1)
}

// note counts hits of a global key asked of this region, and wakes the
// sync loop.
func (rs *regions) note(k lease.Key, home string, hits int64) {
	rs.mu.Lock()
	d := rs.demand[k]
	if d == nil {
		d = &regionDemand{home: home}
		rs.demand[k] = d
	}
	d.cur += max(hits, 1)
	rs.mu.Unlock()
	select {
	case rs.kick <- struct{}{}:
	default:
	}
}

// regionLoop asks the home regions for slices of the global keys this
// node decides, every RegionSync while it has any, and gives back what it
// did not spend; idle, it sleeps until a check of such a key wakes it.
func (n *Node) regionLoop() {
	defer n.wg.Done()
	rs := n.regions
	for {
		select {
		case <-n.stop:
			return
		case <-rs.kick:
		}
		t := time.NewTicker(n.cfg.RegionSync)
		for busy := true; busy; {
			busy = n.regionSync()
			select {
			case <-n.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		t.Stop()
	}
}

// regionSync runs one round of asks and returns, all home regions at once,
// and reports whether there is more to do.
func (n *Node) regionSync() bool {
	rs := n.regions
	now := n.now().UnixNano()
	rs.table.Sweep(now)
	returns := rs.table.TakeReturns(nil)
	asks := map[string][]check.RegionAsk{} // by home region
	period := n.cfg.RegionSync
	rs.mu.Lock()
	for k, d := range rs.demand {
		rate := max(d.cur, d.prev) // hits per period
		d.prev, d.cur = d.cur, 0
		if rate == 0 {
			d.idle++
			if d.idle > 50 && rs.table.Left(k, now) == 0 {
				delete(rs.demand, k)
			}
			continue
		}
		d.idle = 0
		rtt := time.Duration(0)
		if l := rs.links[d.home]; l != nil {
			rtt = l.rtt
		}
		// Enough to last until the slice after next can arrive: two
		// periods and two round trips.
		horizon := 2*period + 2*rtt
		want := int64(math.Ceil(float64(rate)*float64(horizon)/float64(period))) - rs.table.Left(k, now)
		if want > 0 && !rs.table.Refusing(k, now) {
			asks[d.home] = append(asks[d.home], check.RegionAsk{Request: check.Request{Name: k.Name, Key: k.Key, Hits: min(want, lease.MaxTokens), Limit: k.Limit}})
		}
	}
	busy := len(rs.demand) > 0 || rs.table.Len() > 0
	rs.mu.Unlock()

	for _, r := range returns {
		home := rs.home(ring.Hash(r.Key.Name, r.Key.Key))
		asks[home] = append(asks[home], check.RegionAsk{Request: check.Request{Name: r.Key.Name, Key: r.Key.Key, Limit: r.Key.Limit},
			Return: r.Hits, ReturnGrantedAt: r.GrantedAt})
	}
	if len(asks) == 0 {
		return busy || len(returns) > 0
	}
	var wg sync.WaitGroup
	for home, list := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(list) > 0 {
				b := list[:min(len(list), maxReturnBatch)]
				list = list[len(b):]
				n.askRegion(home, b)
			}
		}()
	}
	wg.Wait()
	return true
}

// askRegion sends asks to a node of region home, trying its addresses in
// turn from the last that answered, and keeps the slices it lends.
func (n *Node) askRegion(home string, asks []check.RegionAsk) {
	rs := n.regions
	rp, ok := n.peers.(RegionPeers)
	if !ok {
		return
	}
	rs.mu.Lock()
	l := rs.links[home]
	if l == nil {
		rs.mu.Unlock()
		return
	}
	addrs, first := l.addrs, l.next
	rs.mu.Unlock()
	q := &check.RegionQuery{From: n.name, Region: rs.self, ToRegion: home, Asks: asks}
	ans := make([]check.RegionAnswer, len(asks))
	timeout := max(n.cfg.RegionCutAfter/2, 100*time.Millisecond)
	for try := range min(len(addrs), 2) {
		i := (first + try) % len(addrs)
		sent := n.now().UnixNano()
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		region, err := rp.RegionGrant(ctx, addrs[i], q, ans)
		cancel()
		if err == nil && region != home {
			err = fmt.Errorf("%s answers for region %q", addrs[i], region)
		}
		rs.mu.Lock()
		if err != nil {
			l.lastFail, l.failures, l.next = n.now().UnixNano(), l.failures+1, (i+1)%len(addrs)
			rs.mu.Unlock()
			n.log.Debug("region grant failed", "region", home, "addr", addrs[i], "err", err)
			continue
		}
		l.lastOK, l.rtt, l.next, l.asks, l.answered = n.now().UnixNano(), time.Since(start), i, l.asks+uint64(len(asks)), true
		rs.mu.Unlock()
		var lent uint64
		for j, a := range ans {
			if a.Lease.TTL <= 0 || asks[j].Request.Hits < 1 {
				continue
			}
			r := &asks[j].Request
			if rs.table.Put(lease.Key{Name: r.Name, Key: r.Key, Limit: r.Limit}, a.Lease, 1, sent, a.Lease.TTL.Milliseconds(), MaxLeaseTTL) && a.Lease.Tokens > 0 {
				lent += uint64(a.Lease.Tokens)
			}
		}
		rs.mu.Lock()
		l.grants += lent
		rs.mu.Unlock()
		return
	}
}

// GrantRegion answers another region's asks for slices of global keys
// homed in this node's region (peer.RegionGranter). For each key it
// decides here, it first takes back the returned hits of an earlier slice
// (as lease returns are), then lends at most half of what the limit has
// left, for at most RegionLeaseTTL and never past the window's end — or a
// refusal when nothing is left. Asks for keys another node of this region
// owns go on to it (once: a routed query is not passed on).
func (n *Node) GrantRegion(ctx context.Context, q *check.RegionQuery, ans []check.RegionAnswer) string {
	clear(ans)
	if n.regions == nil {
		return "-" // no region: the asker sees the wrong region and tries elsewhere
	}
	if q.ToRegion != n.regions.self {
		return n.regions.self
	}
	from := ring.Hash("region\x00"+q.Region+"\x00"+q.From, "")
	now := n.now().UnixNano()
	var onward map[string][]int // owner address → asks
	for i := range q.Asks {
		if ctx.Err() != nil {
			break
		}
		if addr := n.grantRegionAsk(ctx, &q.Asks[i], from, now, &ans[i]); addr != "" && !q.Routed {
			if onward == nil {
				onward = map[string][]int{}
			}
			onward[addr] = append(onward[addr], i)
		}
	}
	rp, ok := n.peers.(RegionPeers)
	if !ok {
		return n.regions.self
	}
	for addr, idx := range onward {
		sub := &check.RegionQuery{From: q.From, Region: q.Region, ToRegion: q.ToRegion, Routed: true, Asks: make([]check.RegionAsk, len(idx))}
		for j, i := range idx {
			sub.Asks[j] = q.Asks[i]
		}
		got := make([]check.RegionAnswer, len(idx))
		if _, err := rp.RegionGrant(ctx, addr, sub, got); err != nil {
			n.log.Debug("passing a region grant on failed", "to", addr, "err", err)
			continue
		}
		for j, i := range idx {
			ans[i] = got[j]
		}
	}
	return n.regions.self
}

// grantRegionAsk answers one ask on this node; it returns the address of
// the key's owner in this region when that is another node.
func (n *Node) grantRegionAsk(ctx context.Context, a *check.RegionAsk, from uint64, now int64, out *check.RegionAnswer) string {
	r := &a.Request
	var o check.Outcome
	lims, ok := n.prepare(r, true, &o)
	if !ok || len(lims.more) > 0 || !lims.one.Global || !lease.Leasable(lims.one, 1) {
		return ""
	}
	h := ring.Hash(r.Name, r.Key)
	if n.regions.home(h) != n.regions.self {
		return "" // the asker's regions differ from this node's: lend nothing
	}
	k := writeback.Key{Name: r.Name, Key: r.Key}
	if a.Return > 0 {
		n.gate.RLock()
		eff := ownership.Step(n.facts(n.ring.Table(), h, k, lims, now), ownership.Event{Kind: ownership.Forwarded})
		if eff.Redirect != "" {
			// Another node decides the key (a forwarded event is never
			// forwarded again: Step redirects it): the return goes on to
			// it with the ask.
			n.gate.RUnlock()
			return eff.Redirect
		}
		if eff.DecidesAsItStands() {
			if hits := n.regions.book.Return(h, from, a.ReturnGrantedAt, a.Return); hits > 0 {
				if back, err := n.cache.Refund(h, k, lims.one, hits, a.ReturnGrantedAt, now); err == nil {
					out.Taken = back
					n.stats.leaseTookBack.Add(uint64(back))
				}
			}
		}
		n.gate.RUnlock()
	}
	if r.Hits < 1 {
		return ""
	}
	ev := ownership.Event{Kind: ownership.Forwarded}
	peek := *r
	peek.Hits = 0
	var pd check.Outcome
	if addr := n.decide(ctx, h, &peek, lims, ev, now, &pd); addr != "" {
		return addr
	}
	if pd.Err != "" {
		return ""
	}
	ttl := lease.TTL(lims.one, now, n.cfg.RegionLeaseTTL)
	if ttl <= 0 {
		return ""
	}
	if pd.Status != bucket.UnderLimit || pd.Remaining < 1 {
		if until := lease.RefusalTTL(pd.RetryAfterMS, ttl); until > 0 {
			out.Lease = check.Lease{TTL: until, GrantedAt: now}
		}
		return ""
	}
	size := min(r.Hits, max((pd.Remaining+1)/2, 1), lease.MaxTokens)
	g := *r
	g.Hits = size
	var gd check.Outcome
	if n.decide(ctx, h, &g, lims, ev, now, &gd) != "" || gd.Err != "" || !gd.Allowed() {
		return ""
	}
	n.regions.book.Record(h, from, now, size)
	if last := n.regions.lastSweep.Load(); now-last > int64(time.Second) && n.regions.lastSweep.CompareAndSwap(last, now) {
		// A slice lasts at most RegionLeaseTTL; its return comes within a
		// few sync rounds after: a minute covers both many times over.
		n.regions.book.Sweep(now - int64(n.cfg.RegionLeaseTTL) - int64(time.Minute))
	}
	out.Lease = check.Lease{Tokens: size, TTL: ttl, GrantedAt: now}
	n.stats.regionLent.Add(uint64(size))
	return ""
}

// RegionLink is what Status says about one other region (LastAnswer zero:
// none yet).
type RegionLink struct {
	Region             string
	Cut                bool
	LastAnswer         time.Time
	RTT                time.Duration
	Asks, Lent, Failed uint64
}

// regionStatus returns this node's view of the other regions.
func (n *Node) regionStatus(now int64) []RegionLink {
	rs := n.regions
	if rs == nil {
		return nil
	}
	var out []RegionLink
	for _, r := range rs.names {
		if r == rs.self {
			continue
		}
		cut := n.cut(r, now)
		rs.mu.Lock()
		l := rs.links[r]
		rl := RegionLink{Region: r, Cut: cut, RTT: l.rtt, Asks: l.asks, Lent: l.grants, Failed: l.failures}
		if l.answered {
			rl.LastAnswer = time.Unix(0, l.lastOK)
		}
		out = append(out, rl)
		rs.mu.Unlock()
	}
	return out
}
