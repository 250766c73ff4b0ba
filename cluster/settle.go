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
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// settleKey settles k's cache keys (every limit's) that a recent ring
// change moved here and that are not settled yet: see settleBatch, and
// owner there. It reports false when one stays unsettled because a member
// that may hold a newer copy did not answer: k must not be decided here
// now.
func (n *Node) settleKey(ctx context.Context, h uint64, k writeback.Key, lims limits, now int64, owner bool) bool {
	ms := n.book.Moves()
	if len(lims.more) == 0 {
		return n.settle(ctx, h, k, ms, now, owner)
	}
	ok := true
	for i := range 1 + len(lims.more) {
		ok = n.settle(ctx, h, writeback.SubKey(k, i), ms, now, owner) && ok
	}
	return ok
}

// settle settles one cache key (settleBatch), when a move still has to,
// and reports false when it stays unsettled for want of an answer.
func (n *Node) settle(ctx context.Context, h uint64, k writeback.Key, ms ownership.Moves, now int64, owner bool) bool {
	if !ms.Unsettled(h, k, n.name, now) {
		return true
	}
	return n.settleBatch(ctx, []settleItem{{h: h, k: k}}, ms, now, owner) == nil
}

// errUnsettled is the error of a check on a key that a ring change moved
// here and that no node which may hold a newer copy answered a pull of,
// one of them still a member (settleBatch). It begins with abandoned: this node decided nothing, and the
// node that forwarded the check, or this one when the check came here
// first, fails it over to the key's replica (failover), which holds the
// count, rather than have it decided from an older copy here. A decision
// from the older copy would carry a newer version than the holder's count,
// outrank it, and lose every hit that count holds.
const errUnsettled = abandoned + "no node that may hold a newer count of the key answered its pull"

// settleItem is one cache key to settle, and what was found for it.
type settleItem struct {
	h     uint64
	k     writeback.Key
	asked []keymove.Holder // nodes asked, deduplicated by address
	moves ownership.Moves  // the moves it is settled for
	best  bucket.Counter
	// unanswered holds the addresses whose last pull of the key failed
	// (an error or no answer within PullTimeout); answered counts the
	// answers that tell something of the key: a copy, or, from a node
	// asked to release it (its previous owner), that there is none. An
	// empty answer from a node asked without release (a replica of the
	// key in this node's table, which may not have received it yet) does
	// not count.
	unanswered []string
	answered   int
}

// maxPullRounds bounds the rounds of pulls settleBatch makes for a batch:
// the nodes its plan names, then one round of the nodes their answers name
// (moved_to, holders). Each round is bounded by PullTimeout, and two of
// them (200 ms by default) fit in a forward's deadline (ForwardTimeout,
// 250 ms), which a node settling a forwarded check must answer within.
const maxPullRounds = 2

// settleBatch settles the keys of a batch that recent ring changes moved
// here: for each key it asks the nodes ownership.Moves.Plan names (the
// previous owner and its replicas, and more in the cases Plan lists), then
// the nodes the answers name: where a key had been handed on (moved_to),
// and the holders a node that never settled the key would have asked.
// It adopts the merge of the copies it got (mergeCopies), unless this node
// released the key while the pulls were out: the node that took it then
// holds this node's state and decides it, and a check here is pointed
// there or pulls it back (decideGated). The pulls go one call per node for
// the whole batch, to every node at once, so settling a batch costs about
// two round trips however many keys it holds — a key-by-key settle of a
// 100-item batch after a membership change would outlast the sender's
// forward deadline, and the sender would have the batch decided again by a
// replica.
//
// For the checks this node decides as the keys' owner (owner set: see
// owning), a pull that fails is made again in the next round when the
// caller's deadline leaves time for it, and a key that no node asked
// answered for (answered), while one that did not is still a member of
// this node's table, stays unsettled, to be pulled again on its next
// touch: that member (its previous owner, slow to answer on a loaded
// machine) may hold the newest count, and this node's own copy may be
// minutes old.
// settleBatch returns the ring hashes of those keys (nil when none),
// which the caller must not decide now (errUnsettled). When a node asked
// did answer (the previous owner's replica, say), its copy is at most a
// replication round behind the owner's, as after a crash, and the key is
// settled. A node asked that is no longer a member handed its counters on
// when it left, or its replicas hold them. A stand-in's or a
// failover's check (owner unset) is the fallback already: its keys are
// settled once the pulls are done, answered or not, as a side of a
// partition settles them, and it is decided from what this node holds.
func (n *Node) settleBatch(ctx context.Context, items []settleItem, ms ownership.Moves, now int64, owner bool) (deferred []uint64) {
	cur := n.ring.Table()
	for i := range items {
		it := &items[i]
		it.asked, it.moves = ms.Plan(it.h, it.k, n.name, cur, now, it.asked)
	}
	n.pullRounds(ctx, items, owner)
	for i := range items {
		it := &items[i]
		if n.debug {
			n.log.Debug("settled", "name", it.k.Name, "key", it.k.Key, "asked", len(it.asked), "count", it.best.State.Count,
				"version", it.best.Version, "moves", len(it.moves), "ctx_err", ctx.Err())
		}
		if it.best.Version > 0 {
			n.cache.InstallUnlessFencedSince(it.h, writeback.Record{Key: it.k, State: it.best.State, Version: it.best.Version}, now)
		}
		if ctx.Err() != nil {
			// A key whose caller gave up is not settled: its pulls may have
			// failed for that reason alone, and the next touch asks again.
			continue
		}
		if addr, ok := memberOf(cur, it.unanswered); ok && owner && it.answered == 0 && !pauseOnly(it.moves) {
			// The check fails over to the key's first replica, which decides
			// it as a stand-in: the next decision here pulls that decision,
			// even once the move's window has ended (standins.go).
			n.stoodIn.note(it.k, now, now+int64(standInMemory))
			n.stats.settlesDeferred.Add(1)
			n.log.Debug("not settled: no node asked answered its pull", "name", it.k.Name, "key", it.k.Key, "member_addr", addr)
			deferred = append(deferred, it.h)
			continue
		}
		ownership.Settled(it.k, it.moves)
	}
	return deferred
}

// pauseOnly reports whether every move in ms is a pause's. A node that
// noticed a pause pulls every key it owns, and when it is starved (a
// squeezed cgroup, a saturated machine) its own slowness makes those
// pulls time out: deferring its checks to failover would add work where
// it has least, and its checks past their deadlines (TestStarvedClusterStaysUp).
// It decides from what it holds, as before; the pause's own guarantee
// (docs/guarantees.md) covers the keys others decided meanwhile.
func pauseOnly(ms ownership.Moves) bool {
	for _, m := range ms {
		if !m.Pause() {
			return false
		}
	}
	return len(ms) > 0
}

// memberOf returns the first of addrs that is the address of a member of
// tbl.
func memberOf(tbl *ring.Table, addrs []string) (string, bool) {
	if len(addrs) == 0 {
		return "", false
	}
	for _, m := range tbl.Members() {
		if slices.Contains(addrs, m.Addr) {
			return m.Addr, true
		}
	}
	return "", false
}

// pullRounds pulls every item from the nodes in its asked list, then, for
// up to maxPullRounds-1 more rounds, from the nodes the answers name: a
// node asked had already handed the key on, or had not settled it itself
// since a move, and the node it went to, or the nodes it would have pulled
// it from, may hold a newer state (ownership.Follow). With retry, a pull
// that failed is made again in the next round when ctx's deadline leaves
// time for one more pull (timeForPull).
func (n *Node) pullRounds(ctx context.Context, items []settleItem, retry bool) {
	more := n.pullAll(ctx, items, func(it *settleItem) []keymove.Holder { return it.asked }, retry)
	for round := 1; len(more) > 0 && round < maxPullRounds; round++ {
		next := more
		more = n.pullAll(ctx, items, func(it *settleItem) []keymove.Holder { return next[it] }, retry)
	}
}

// timeForPull reports whether ctx leaves time for one more pull and a
// decision after it: half a PullTimeout more than the pull may take.
func (n *Node) timeForPull(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > n.cfg.PullTimeout*3/2
}

// pullAll pulls every item from the nodes targets names for it: one Pull
// per node and release flag, all at once, each bounded by PullTimeout. It
// keeps in best the merge of each item's copies (mergeCopies) and in
// unanswered the nodes whose pull failed, and returns whom to pull next:
// where released copies had already gone (addresses not asked yet, and
// not this node), and, with retry, the nodes whose pull failed when ctx
// leaves time to ask them again.
func (n *Node) pullAll(ctx context.Context, items []settleItem, targets func(*settleItem) []keymove.Holder, retry bool) map[*settleItem][]keymove.Holder {
	type call struct {
		to   keymove.Holder
		its  []*settleItem
		keys []bucket.Counter
		ans  []keymove.PullAnswer
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
			c.keys = append(c.keys, writeback.CounterOf(it.k))
		}
	}
	pull := func(c *call) {
		var ttl time.Duration
		if c.to.Release {
			ttl = n.cfg.MoveWindow
		}
		c.ans = make([]keymove.PullAnswer, len(c.keys))
		pctx, cancel := context.WithTimeout(ctx, n.cfg.PullTimeout)
		c.err = n.peers.Pull(pctx, c.to.Addr, c.keys, c.to.Release, ttl, c.ans)
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
	var moved map[*settleItem][]keymove.Holder
	retry = retry && n.timeForPull(ctx)
	for _, c := range calls {
		n.stats.pulls.Add(uint64(len(c.keys)))
		if c.err != nil {
			n.stats.pullErrors.Add(uint64(len(c.keys)))
			if n.debug {
				n.log.Debug("pull failed", "to", c.to.Addr, "keys", len(c.keys), "release", c.to.Release, "err", c.err)
			}
			for _, it := range c.its {
				if !slices.Contains(it.unanswered, c.to.Addr) {
					it.unanswered = append(it.unanswered, c.to.Addr)
				}
				if retry {
					if moved == nil {
						moved = make(map[*settleItem][]keymove.Holder)
					}
					moved[it] = append(moved[it], c.to)
				}
			}
			continue
		}
		for j, got := range c.keys {
			it := c.its[j]
			it.unanswered = slices.DeleteFunc(it.unanswered, func(a string) bool { return a == c.to.Addr })
			if c.to.Release || got.Version > 0 {
				it.answered++
			}
			it.best = mergeCopies(it.best, got)
			follow := func(addr string, release bool) {
				if src, ok := ownership.Follow(it.asked, addr, release, n.cfg.GRPCAddr); ok {
					if moved == nil {
						moved = make(map[*settleItem][]keymove.Holder)
					}
					it.asked = append(it.asked, src)
					moved[it] = append(moved[it], src)
				}
			}
			follow(c.ans[j].MovedTo, true)
			for _, h := range c.ans[j].Holders {
				follow(h.Addr, h.Release)
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

// pullKey pulls k's counters (every limit's) from the node at addr,
// releasing them there, and from the nodes its answer names (where it had
// released them to, or the holders it would have asked), as a settle does
// (pullRounds), and installs the merge of what it got. A failed pull is
// counted and the decision goes on with what this node holds.
func (n *Node) pullKey(ctx context.Context, h uint64, k writeback.Key, lims limits, addr string) {
	var items []settleItem
	if len(lims.more) == 0 {
		items = []settleItem{{h: h, k: k, asked: []keymove.Holder{{Addr: addr, Release: true}}}}
	} else {
		for i := range 1 + len(lims.more) {
			items = append(items, settleItem{h: h, k: writeback.SubKey(k, i), asked: []keymove.Holder{{Addr: addr, Release: true}}})
		}
	}
	n.pullRounds(ctx, items, false)
	for _, it := range items {
		if n.debug {
			n.log.Debug("pulled back", "name", it.k.Name, "key", it.k.Key, "from", addr, "asked", len(it.asked), "count", it.best.State.Count, "version", it.best.Version)
		}
		if it.best.Version > 0 {
			n.cache.Install(h, writeback.Record{Key: it.k, State: it.best.State, Version: it.best.Version})
		}
	}
}
