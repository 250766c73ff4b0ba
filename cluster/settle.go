package cluster

// Settling keys that a ring change moved here: on first touch, before
// deciding, a moved key is pulled from the nodes that held it (its previous
// owner, that owner's replicas, and more in the cases settleBatch lists)
// and the copies are merged into this node's. In docs/ownership.md's
// terms: a key is unsettled while a move in its window applies to it and
// it is not in the move's settled set; settleBatch pulls it (pulling) and
// it is then owned. handoff.go has the other side (push, replicate, drain).

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// move is one recent ring change that gave this node partitions: keys of
// those partitions are pulled from their holder under prev on first touch.
type move struct {
	prev  *ring.Table
	until int64 // Unix ns; no pulls after it
	// cur is set when this node entered the ring with this change (a start
	// or a restart): the key's replicas in cur may hold newer counts than
	// the previous owner, because they stood in for this node while it was
	// unreachable and the others had not yet declared it dead.
	cur *ring.Table
	// owned limits the move to the keys this node owns in cur: set after
	// a pause (pausedFor), where the node's ring did not change and only
	// the keys it owns were decided elsewhere.
	owned   bool
	settled sync.Map // writeback.Key → struct{}: pulled or handed over
}

// applies reports whether m brought k (ring hash h) to the node self.
func (m *move) applies(h uint64, self string) bool {
	if prev, ok := m.prev.Owner(h); !ok || prev.Name == self {
		return false
	}
	if m.owned {
		if o, ok := m.cur.Owner(h); !ok || o.Name != self {
			return false
		}
	}
	return true
}

// addMove makes m the newest of the node's moves, dropping those whose
// window ended before now.
func (n *Node) addMove(m *move, now int64) {
	n.movesMu.Lock()
	defer n.movesMu.Unlock()
	ms := []*move{m}
	if cur := n.moves.Load(); cur != nil {
		for _, m := range *cur {
			if m.until > now {
				ms = append(ms, m)
			}
		}
	}
	n.moves.Store(&ms)
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
		if now > m.until || !m.applies(h, self) {
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
//     stand-in checks should come here;
//   - when neither the previous owner nor any of its replicas (this node
//     included) is in this node's current ring, every other member, without
//     releasing: see the comment in the loop.
//
// It adopts the merge of the copies it got (mergeCopies), unless this node released the key
// while the pulls were out: the node that took it then holds this node's
// state and decides it, and a check here is pointed there or pulls it back
// (decideGated). The pulls go one call per node for
// the whole batch, to every node at once, so settling a batch costs about
// two round trips however many keys it holds — a key-by-key settle of a
// 100-item batch after a membership change would outlast the sender's
// forward deadline, and the sender would have the batch decided again by a
// replica.
func (n *Node) settleBatch(ctx context.Context, items []settleItem, moves []*move, now int64) {
	var reps, members []ring.Member
	cur := n.ring.Table()
	for i := range items {
		it := &items[i]
		for _, m := range moves {
			if now > m.until || !m.applies(it.h, n.name) {
				continue
			}
			prev, _ := m.prev.Owner(it.h)
			if _, done := m.settled.Load(it.k); done {
				break
			}
			it.moves = append(it.moves, m)
			it.ask(prev.Addr, true)
			reps = m.prev.Replicas(it.h, reps[:0])
			held := hasMember(cur, prev.Name)
			for _, r := range reps[min(1, len(reps)):] {
				held = held || hasMember(cur, r.Name)
				if r.Name != n.name && r.Name != prev.Name {
					it.ask(r.Addr, false)
				}
			}
			if !held {
				// Every node that held the key is gone from this node's
				// ring (the other side of a partition, or several
				// crashes): the members left may each have decided it
				// from their own cache meanwhile, reaching neither holder
				// (--on-owner-unavailable=serve). Their copies are merged
				// in too, without releasing them: they do not own it.
				if members == nil {
					members = cur.Members()
				}
				for _, mb := range members {
					if mb.Name != n.name {
						it.ask(mb.Addr, false)
					}
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
		if len(it.moves) > 0 && ctx.Err() == nil {
			// A key whose caller gave up is not settled: its pulls may have
			// failed for that reason alone, and the next touch asks again.
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
// keeps in best the merge of each item's copies (mergeCopies), and returns where released copies
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
			it.best = mergeCopies(it.best, got)
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

// mergeCopies combines two copies of a key pulled from different nodes
// (Version 0: none): their merge where bucket.Merge has a rule for the
// algorithm (the sides of a healed partition may each hold hits the other
// has not seen), the newer version otherwise. The result carries the
// larger version, so that it outranks both copies' holders.
func mergeCopies(best, got bucket.Counter) bucket.Counter {
	switch {
	case got.Version == 0:
		return best
	case best.Version == 0:
		return got
	}
	if st, ok := bucket.Merge(best.State, got.State); ok {
		best.State = st
		best.Version = max(best.Version, got.Version)
		return best
	}
	if got.Version > best.Version {
		return got
	}
	return best
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
