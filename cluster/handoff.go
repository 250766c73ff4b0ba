package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// This file keeps counts through membership changes:
//
//   - Replication: every change to a counter this node owns marks its key;
//     every ReplicationInterval the marked keys' current records go to the
//     other nodes of the key's replica set, one Replicate call per node.
//     Receivers install a copy only when its version is newer.
//   - Handoff: when a ring change moves partitions away from this node, it
//     releases the keys of those partitions it holds in memory (it stops
//     deciding them) and pushes their records to the new owners. A node
//     that gained partitions pulls a moved key from its previous owner (or,
//     failing that, the previous owner's replicas) on first touch, before
//     deciding, for MoveWindow after the change.
//   - Graceful leave: the node announces it is leaving (the others drop it
//     from their rings at once), stops deciding, flushes, pushes every
//     counter it holds to the keys' next owners and only then leaves the
//     gossip pool.

// move is one recent ring change that gave this node partitions: keys of
// those partitions are pulled from their holder under prev on first touch.
type move struct {
	prev  *ring.Table
	until int64 // Unix ns; no pulls after it
	// cur is set when this node entered the ring with this change (a start
	// or a restart): the key's replicas in cur may hold newer counts than
	// the previous owner, because they stood in for this node while it was
	// unreachable and the others had not yet declared it dead.
	cur     *ring.Table
	settled sync.Map // writeback.Key → struct{}: pulled or handed over
}

// settle makes sure this node holds the newest record of a key that a
// recent ring change moved here, before it decides the key: see
// settleBatch. Each key is pulled at most once per change.
func (n *Node) settle(ctx context.Context, h uint64, k writeback.Key, moves []*move, now int64) {
	if !needsSettle(h, k, moves, n.name, now) {
		return
	}
	n.settleBatch(ctx, []settleItem{{h: h, k: k}}, moves, now)
}

// needsSettle reports whether some recent move brought k here and k has
// not been settled since.
func needsSettle(h uint64, k writeback.Key, moves []*move, self string, now int64) bool {
	for _, m := range moves {
		if now > m.until {
			continue
		}
		if prev, ok := m.prev.Owner(h); !ok || prev.Name == self {
			continue
		}
		_, done := m.settled.Load(k)
		return !done
	}
	return false
}

// anyActive reports whether some move is still within its window at now.
func anyActive(moves []*move, now int64) bool {
	for _, m := range moves {
		if now <= m.until {
			return true
		}
	}
	return false
}

// settleItem is one cache key to settle, and what was found for it.
type settleItem struct {
	h     uint64
	k     writeback.Key
	asked []pullFrom // nodes asked, deduplicated by address
	moves []*move    // the moves it is settled for
	best  bucket.Counter
}

// pullFrom is one node to pull a key from, releasing it there or not.
type pullFrom struct {
	addr    string
	release bool
}

// settleBatch settles the keys of a batch that recent ring changes moved
// here. For each key and each change it asks:
//   - the previous owner, releasing the key there (so it stops deciding
//     it); when that owner had already handed the key on, the node it went
//     to as well;
//   - the previous owner's replicas, whether the owner answered or not: a
//     replica that stood in for it while it was unreachable holds newer
//     counts than it does (it may have restarted from a stale store);
//   - when this node entered the ring with the change (a start or a
//     restart), the key's current replicas, releasing it there: they may
//     have stood in for this node while it was unreachable, and from now on
//     stand-in checks should come here.
//
// It adopts the newest copy of each key, unless this node released the key
// while the pulls were out: the node that took it then holds this node's
// state and decides it, and a check here is pointed there or pulls it back
// (decideGated). The pulls go one call per node for
// the whole batch, to every node at once, so settling a batch costs about
// two round trips however many keys it holds — a key-by-key settle of a
// 100-item batch after a membership change would outlast the sender's
// forward deadline, and the sender would have the batch decided again by a
// replica.
func (n *Node) settleBatch(ctx context.Context, items []settleItem, moves []*move, now int64) {
	var reps []ring.Member
	for i := range items {
		it := &items[i]
		for _, m := range moves {
			if now > m.until {
				continue
			}
			prev, ok := m.prev.Owner(it.h)
			if !ok || prev.Name == n.name {
				continue
			}
			if _, done := m.settled.Load(it.k); done {
				break
			}
			it.moves = append(it.moves, m)
			it.ask(prev.Addr, true)
			reps = m.prev.Replicas(it.h, reps[:0])
			for _, r := range reps[min(1, len(reps)):] {
				if r.Name != n.name && r.Name != prev.Name {
					it.ask(r.Addr, false)
				}
			}
			if m.cur != nil {
				reps = m.cur.Replicas(it.h, reps[:0])
				for _, r := range reps {
					if r.Name != n.name && r.Name != prev.Name {
						it.ask(r.Addr, true)
					}
				}
			}
		}
	}
	moved := n.pullAll(ctx, items, func(it *settleItem) []pullFrom { return it.asked })
	if len(moved) > 0 {
		// A node asked had already handed the key on: the node it went to
		// holds the newest state.
		n.pullAll(ctx, items, func(it *settleItem) []pullFrom { return moved[it] })
	}
	for i := range items {
		it := &items[i]
		if it.best.Version > 0 {
			n.cache.AdoptUnlessReleasedSince(it.h, writeback.Record{Key: it.k, State: it.best.State, Version: it.best.Version}, now)
		}
		if len(it.moves) > 0 {
			k := cloneKey(it.k)
			for _, m := range it.moves {
				m.settled.Store(k, struct{}{})
			}
		}
	}
}

// ask adds addr to the nodes to ask for it (releasing there when any
// reason to ask says so).
func (it *settleItem) ask(addr string, release bool) {
	for j := range it.asked {
		if it.asked[j].addr == addr {
			it.asked[j].release = it.asked[j].release || release
			return
		}
	}
	it.asked = append(it.asked, pullFrom{addr, release})
}

// pullAll pulls every item from the nodes targets names for it: one Pull
// per node and release flag, all at once, each bounded by PullTimeout. It
// keeps each item's newest copy in best, and returns where released copies
// had already gone (addresses not asked yet, and not this node).
func (n *Node) pullAll(ctx context.Context, items []settleItem, targets func(*settleItem) []pullFrom) map[*settleItem][]pullFrom {
	type call struct {
		to   pullFrom
		its  []*settleItem
		keys []bucket.Counter
		err  error
	}
	var calls []*call
	for i := range items {
		it := &items[i]
		for _, to := range targets(it) {
			var c *call
			for _, x := range calls {
				if x.to == to {
					c = x
					break
				}
			}
			if c == nil {
				c = &call{to: to}
				calls = append(calls, c)
			}
			c.its = append(c.its, it)
			c.keys = append(c.keys, bucket.Counter{Name: it.k.Name, Key: it.k.Key})
		}
	}
	pull := func(c *call) {
		var ttl time.Duration
		if c.to.release {
			ttl = n.cfg.MoveWindow
		}
		pctx, cancel := context.WithTimeout(ctx, n.cfg.PullTimeout)
		c.err = n.peers.Pull(pctx, c.to.addr, c.keys, c.to.release, ttl)
		cancel()
	}
	var wg sync.WaitGroup
	for _, c := range calls[min(1, len(calls)):] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pull(c)
		}()
	}
	if len(calls) > 0 {
		pull(calls[0])
	}
	wg.Wait()
	var moved map[*settleItem][]pullFrom
	for _, c := range calls {
		n.pulls.Add(uint64(len(c.keys)))
		if c.err != nil {
			n.pullErrors.Add(uint64(len(c.keys)))
			continue
		}
		for j, got := range c.keys {
			it := c.its[j]
			if got.Version > it.best.Version {
				it.best = got
			}
			if to := got.MovedTo; to != "" && to != n.cfg.GRPCAddr && !it.asks(to) {
				if moved == nil {
					moved = make(map[*settleItem][]pullFrom)
				}
				it.asked = append(it.asked, pullFrom{to, true})
				moved[it] = append(moved[it], pullFrom{to, true})
			}
		}
	}
	return moved
}

// asks reports whether addr is among the nodes asked for it.
func (it *settleItem) asks(addr string) bool {
	for _, a := range it.asked {
		if a.addr == addr {
			return true
		}
	}
	return false
}

// keyHash is the ring hash of a cache key: that of its (name, key), also
// for the sub-keys of multi-limit checks, which live with their key.
func keyHash(k writeback.Key) uint64 {
	b := writeback.BaseKey(k)
	return ring.Hash(b.Name, b.Key)
}

func cloneKey(k writeback.Key) writeback.Key {
	return writeback.Key{Name: strings.Clone(k.Name), Key: strings.Clone(k.Key)}
}

// pullKey pulls k's counters (every limit's) from the node at addr,
// releasing them there, and adopts what is newer. A failed pull is counted
// and the decision goes on with what this node holds.
func (n *Node) pullKey(ctx context.Context, h uint64, k writeback.Key, lims limits, addr string) {
	var keys []bucket.Counter
	if len(lims.more) == 0 {
		keys = []bucket.Counter{{Name: k.Name, Key: k.Key}}
	} else {
		for i := range 1 + len(lims.more) {
			sk := writeback.SubKey(k, i)
			keys = append(keys, bucket.Counter{Name: sk.Name, Key: sk.Key})
		}
	}
	pctx, cancel := context.WithTimeout(ctx, n.cfg.PullTimeout)
	err := n.peers.Pull(pctx, addr, keys, true, n.cfg.MoveWindow)
	cancel()
	n.pulls.Add(1)
	if err != nil {
		n.pullErrors.Add(1)
		return
	}
	for _, c := range keys {
		if c.Version > 0 {
			n.cache.Adopt(h, writeback.Record{Key: writeback.Key{Name: c.Name, Key: c.Key}, State: c.State, Version: c.Version})
		}
	}
}

// markSettled records that k arrived by handoff: no pull is needed.
func (n *Node) markSettled(k writeback.Key) {
	if ms := n.moves.Load(); ms != nil {
		for _, m := range *ms {
			m.settled.Store(cloneKey(k), struct{}{})
		}
	}
}

// tableChanged registers what a ring change from old to cur moved to this
// node, before cur becomes current, and reports whether partitions moved
// away from it (to hand off once cur is current). A joining node enters its
// own ring only once it knows every member (see metaReady), so its old
// table is the cluster's table without it.
func (n *Node) tableChanged(old, cur *ring.Table) (lost bool) {
	if cur.Len() <= 1 && old.Len() <= 1 {
		return false
	}
	now := n.now().UnixNano()
	gained := false
	for p := range cur.Partitions() {
		o, _ := old.PartitionOwner(p)
		c, _ := cur.PartitionOwner(p)
		gained = gained || (c.Name == n.name && o.Name != n.name && o.Name != "")
		lost = lost || (o.Name == n.name && c.Name != n.name && c.Name != "")
	}
	if gained {
		m := &move{prev: old, until: now + int64(n.cfg.MoveWindow)}
		if !hasMember(old, n.name) && hasMember(cur, n.name) {
			m.cur = cur
		}
		ms := []*move{m}
		if cur := n.moves.Load(); cur != nil {
			for _, m := range *cur {
				if m.until > now {
					ms = append(ms, m)
				}
			}
		}
		n.moves.Store(&ms)
		n.log.Info("partitions moved here; pulling moved keys on first touch", "window", n.cfg.MoveWindow)
	}
	return lost
}

// hasMember reports whether name is a member of t.
func hasMember(t *ring.Table, name string) bool {
	_, ok := t.Shares()[name]
	return ok
}

type handoffJob struct{ old, cur *ring.Table }

func (n *Node) handoffLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case job := <-n.handoffs:
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.HandoffTimeout)
			n.handOffMoved(ctx, job.old, job.cur)
			cancel()
		}
	}
}

// handOffMoved releases the keys in memory whose partitions moved away from
// this node and pushes them to their new owners.
func (n *Node) handOffMoved(ctx context.Context, old, cur *ring.Table) {
	now := n.now().UnixNano()
	start := time.Now()
	batches := map[string][]bucket.Counter{}
	n.cache.Range(now, func(r writeback.Record) bool {
		h := keyHash(r.Key)
		o, _ := old.Owner(h)
		c, ok := cur.Owner(h)
		if !ok || o.Name != n.name || c.Name == n.name {
			return true
		}
		rec, held, err := n.cache.Release(h, r.Key, now, n.cfg.MoveWindow)
		if err != nil || !held {
			return true
		}
		n.releasedTo.Store(cloneKey(r.Key), c.Addr)
		batches[c.Addr] = append(batches[c.Addr], bucket.Counter{Name: r.Key.Name, Key: r.Key.Key, State: rec.State, Version: rec.Version})
		return true
	})
	sent := n.push(ctx, batches)
	if sent > 0 {
		n.log.Info("handed off moved counters", "counters", sent, "took", time.Since(start))
	}
}

// push sends batches (by gRPC address) as handoffs, in parallel, and
// returns how many counters the new owners received.
func (n *Node) push(ctx context.Context, batches map[string][]bucket.Counter) int {
	var wg sync.WaitGroup
	var sent atomic.Int64
	for addr, cs := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := n.peers.Replicate(ctx, addr, true, cs); err != nil {
				n.handoffErrors.Add(uint64(len(cs)))
				n.log.Warn("handoff failed; the new owner will pull on first touch", "to", addr, "counters", len(cs), "err", err)
				return
			}
			sent.Add(int64(len(cs)))
		}()
	}
	wg.Wait()
	n.handedOff.Add(uint64(sent.Load()))
	return int(sent.Load())
}

func (n *Node) replicateLoop() {
	n.every(n.cfg.ReplicationInterval, func(time.Time) bool {
		ctx, cancel := context.WithTimeout(context.Background(), max(n.cfg.ReplicationInterval*5, time.Second))
		defer cancel()
		n.ReplicateNow(ctx) // failures are counted and the keys kept for the next round
		return true
	})
}

// ReplicateNow sends every counter changed since the last round to the
// other nodes of its replica set. Keys whose send failed are kept for the
// next round. It returns the first error. A round already in progress (the
// periodic one) has taken its changes with it, so ReplicateNow first waits
// for that round to end: when it returns nil, every change made before the
// call is on the replicas.
func (n *Node) ReplicateNow(ctx context.Context) error {
	select {
	case n.replRound <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("cluster: replicate: waiting for the round in progress: %w", ctx.Err())
	}
	defer func() { <-n.replRound }()
	tbl := n.ring.Table()
	now := n.now().UnixNano()
	type batch struct {
		counters []bucket.Counter
		hashes   []uint64
	}
	batches := map[string]*batch{}
	var reps []ring.Member
	n.cache.TakeChanged(now, func(h uint64, rec writeback.Record) {
		reps = tbl.Replicas(h, reps[:0])
		if len(reps) < 2 {
			return
		}
		c := bucket.Counter{Name: rec.Key.Name, Key: rec.Key.Key, State: rec.State, Version: rec.Version}
		for _, r := range reps {
			if r.Name == n.name {
				continue
			}
			b := batches[r.Addr]
			if b == nil {
				b = &batch{}
				batches[r.Addr] = b
			}
			b.counters = append(b.counters, c)
			b.hashes = append(b.hashes, h)
		}
	})
	if len(batches) == 0 {
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(batches))
	for addr, b := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := n.peers.Replicate(ctx, addr, false, b.counters); err != nil {
				n.replicationErrors.Add(uint64(len(b.counters)))
				for i, c := range b.counters {
					n.cache.MarkChanged(b.hashes[i], writeback.Key{Name: c.Name, Key: c.Key})
				}
				errs <- fmt.Errorf("replicate %d counters to %s: %w", len(b.counters), addr, err)
				return
			}
			n.replicated.Add(uint64(len(b.counters)))
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// Replicate installs counters sent by another node: replica copies, or,
// with handoff, counters this node now owns. It implements the receiving
// side of Peers.Replicate.
func (n *Node) Replicate(ctx context.Context, from string, handoff bool, counters []bucket.Counter) (installed, stale int) {
	if handoff && n.draining.Load() {
		// This node is leaving too and has already handed its own counters
		// on: it cannot take these. The sender keeps them in its store.
		return 0, len(counters)
	}
	tbl := n.ring.Table()
	for _, c := range counters {
		rec := writeback.Record{Key: writeback.Key{Name: c.Name, Key: c.Key}, State: c.State, Version: c.Version}
		h := keyHash(rec.Key)
		if o, _ := tbl.Owner(h); !handoff && o.Name == n.name && !n.draining.Load() {
			// A copy from a node that still believes it owns this key: the
			// owner's own state is authoritative; a copy never replaces it.
			stale++
			continue
		}
		var ok bool
		if handoff {
			ok = n.cache.Adopt(h, rec)
			n.markSettled(rec.Key)
		} else {
			ok = n.cache.Merge(h, rec)
		}
		if ok {
			installed++
		} else {
			stale++
		}
	}
	return installed, stale
}

// Pull answers another node's pull: the current record of each key, and with
// release this node stops deciding those keys for ttl, redirecting them to
// the puller. It implements the receiving side of Peers.Pull.
func (n *Node) Pull(ctx context.Context, from string, keys []bucket.Counter, release bool, ttl time.Duration) {
	now := n.now().UnixNano()
	addr := ""
	if release {
		addr = n.addrOf(from)
	}
	for i := range keys {
		k := writeback.Key{Name: keys[i].Name, Key: keys[i].Key}
		h := keyHash(k)
		var rec writeback.Record
		var ok bool
		var err error
		keys[i].MovedTo = ""
		if release && !n.draining.Load() {
			// A key already released to another node: that node has the
			// newer state; say so, so that the puller asks it too.
			if to, ok := n.releasedTo.Load(k); ok && to.(string) != addr && n.cache.Released(h, k, now) {
				keys[i].MovedTo = to.(string)
			}
			// Released keys are redirected to the puller from now on.
			rec, ok, err = n.cache.Release(h, k, now, ttl)
			if addr != "" {
				n.releasedTo.Store(cloneKey(k), addr)
			}
		} else {
			rec, ok, err = n.cache.Get(h, k, now)
		}
		if err != nil {
			n.log.Warn("pull: store read failed", "from", from, "name", k.Name, "key", k.Key, "err", err)
		}
		keys[i].State, keys[i].Version = bucket.State{}, 0
		if ok {
			keys[i].State, keys[i].Version = rec.State, rec.Version
		}
	}
}

// addrOf returns the gRPC address of the member named (or addressed) id.
func (n *Node) addrOf(id string) string {
	for _, m := range n.roster.all() {
		if m.metaErr == nil && (m.name == id || m.meta.grpcAddr == id) {
			return m.meta.grpcAddr
		}
	}
	return ""
}

// movedTo returns where a key this node released now lives: the node that
// pulled it, or the key's owner in the current ring when that is another
// node. It returns "" when neither is known.
func (n *Node) movedTo(h uint64, k writeback.Key) string {
	if v, ok := n.releasedTo.Load(k); ok {
		return v.(string)
	}
	if o, ok := n.ring.Table().Owner(h); ok && o.Name != n.name {
		return o.Addr
	}
	return ""
}

// drain hands every counter this node holds to the keys' next owners, once
// the node is draining (it decides nothing more): it waits for decisions in
// progress, flushes, then pushes the store's live records.
func (n *Node) drain(ctx context.Context) error {
	// Decisions hold the gate shared: taking it once waits for those in
	// progress; later ones see draining.
	n.gate.Lock()
	//lint:ignore SA2001 taking the lock is what waits for the decisions in progress
	n.gate.Unlock()
	start := time.Now()
	if err := n.cache.Flush(ctx); err != nil && !errors.Is(err, writeback.ErrClosed) {
		return fmt.Errorf("cluster: drain: flush: %w", err)
	}
	tbl := n.ring.Table()
	now := n.now().UnixNano()
	batches := map[string][]bucket.Counter{}
	err := n.cache.RangeStored(now, func(r writeback.Record) bool {
		o, ok := tbl.Owner(keyHash(r.Key))
		if ok && o.Name != n.name {
			batches[o.Addr] = append(batches[o.Addr], bucket.Counter{Name: r.Key.Name, Key: r.Key.Key, State: r.State, Version: r.Version})
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("cluster: drain: reading the store: %w", err)
	}
	total := 0
	for _, b := range batches {
		total += len(b)
	}
	sent := n.push(ctx, batches)
	n.log.Info("drained: counters handed to their next owners", "counters", total, "sent", sent, "took", time.Since(start))
	if sent < total {
		// Not lost: they are in this node's store, which it loads when it
		// starts again; until then the new owners have the replicas' copies.
		n.log.Warn("drain: some counters were not handed off; they stay in this node's store",
			"not_sent", total-sent, "counters", total)
	}
	return nil
}
