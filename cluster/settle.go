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
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
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
	s := ownership.NewSettle(n.cfg.GRPCAddr, owner)
	s.Add(h, k)
	return n.settleBatch(ctx, s, ms, now) == nil
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

// settleBatch settles the keys of s, a batch that recent ring changes
// moved here: ownership.Settle says whom to pull each key from (the nodes
// ownership.Moves.Plan names, then the nodes the answers name) and, once
// the pulls are done, which keys are settled; this node carries out the
// pulls (pullRounds) and adopts the merge of the copies they brought
// (mergeCopies), unless it released the key while the pulls were out: the
// node that took it then holds this node's state and decides it, and a
// check here is pointed there or pulls it back (decideGated). The pulls go
// one call per node for the whole batch, to every node at once, so
// settling a batch costs about two round trips however many keys it holds
// — a key-by-key settle of a 100-item batch after a membership change
// would outlast the sender's forward deadline, and the sender would have
// the batch decided again by a replica.
//
// It returns the ring hashes of the keys an owner's settle leaves
// unsettled for want of an answer (ownership.Settle.Finish; nil when
// none), which the caller must not decide now (errUnsettled). Their checks
// fail over to the key's first replica, which decides them as a stand-in:
// the next decision here pulls that decision, even once the move's window
// has ended (standins.go).
func (n *Node) settleBatch(ctx context.Context, s *ownership.Settle, ms ownership.Moves, now int64) (deferred []uint64) {
	cur := n.ring.Table()
	s.Plan(ms, n.name, cur, now)
	best := n.pullRounds(ctx, s)
	for i := range best {
		h, k := s.Key(i)
		if n.debug {
			n.log.Debug("settled", "name", k.Name, "key", k.Key, "asked", s.Asked(i), "count", best[i].State.Count,
				"version", best[i].Version, "ctx_err", ctx.Err())
		}
		if best[i].Version > 0 {
			n.adopt(h, writeback.Record{Key: k, State: best[i].State, Version: best[i].Version}, now)
		}
	}
	for _, d := range s.Finish(cur, ctx.Err() != nil) {
		h, k := s.Key(d.Key)
		n.stoodIn.note(k, now, now+int64(standInMemory))
		n.stats.settlesDeferred.Add(1)
		n.log.Debug("not settled: no node asked answered its pull", "name", k.Name, "key", k.Key, "member_addr", d.Member)
		deferred = append(deferred, h)
	}
	return deferred
}

// pullRounds carries out s's pulls, round by round until it asks for no
// more (ownership.Settle.Next), and returns for each of its keys the merge
// of the copies pulled (mergeCopies; Version 0: none).
func (n *Node) pullRounds(ctx context.Context, s *ownership.Settle) []bucket.Counter {
	best := make([]bucket.Counter, s.Len())
	for pulls := s.Next(true); len(pulls) > 0; pulls = s.Next(n.timeForPull(ctx)) {
		n.pullAll(ctx, s, pulls, best)
	}
	return best
}

// timeForPull reports whether ctx leaves time for one more pull and a
// decision after it: half a PullTimeout more than the pull may take.
func (n *Node) timeForPull(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > n.cfg.PullTimeout*3/2
}

// pullAll makes one round's pulls, all at once, each bounded by
// PullTimeout, merges what they brought into best, and tells s how each
// went.
func (n *Node) pullAll(ctx context.Context, s *ownership.Settle, pulls []ownership.PullCall, best []bucket.Counter) {
	type call struct {
		keys []bucket.Counter
		ans  []keymove.PullAnswer
		err  error
	}
	calls := make([]call, len(pulls))
	pull := func(i int) {
		p, c := pulls[i], &calls[i]
		c.keys = make([]bucket.Counter, len(p.Keys))
		for j, ki := range p.Keys {
			_, k := s.Key(ki)
			c.keys[j] = writeback.CounterOf(k)
		}
		var ttl time.Duration
		if p.To.Release {
			ttl = n.cfg.MoveWindow
		}
		c.ans = make([]keymove.PullAnswer, len(c.keys))
		pctx, cancel := context.WithTimeout(ctx, n.cfg.PullTimeout)
		c.err = n.peers.Pull(pctx, p.To.Addr, c.keys, p.To.Release, ttl, c.ans)
		cancel()
	}
	var wg sync.WaitGroup
	for i := 1; i < len(pulls); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pull(i)
		}()
	}
	pull(0)
	wg.Wait()
	for i, p := range pulls {
		c := &calls[i]
		n.stats.pulls.Add(uint64(len(c.keys)))
		if c.err != nil {
			n.stats.pullErrors.Add(uint64(len(c.keys)))
			if n.debug {
				n.log.Debug("pull failed", "to", p.To.Addr, "keys", len(c.keys), "release", p.To.Release, "err", c.err)
			}
			s.Failed(p)
			continue
		}
		copies := make([]bool, len(c.keys))
		for j, got := range c.keys {
			copies[j] = got.Version > 0
			best[p.Keys[j]] = mergeCopies(best[p.Keys[j]], got)
		}
		s.Answered(p, copies, c.ans)
	}
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
// counted and the decision goes on with what this node holds. A key
// released again after mark (Cache.FenceMark), while the pull was out,
// stays released: the node that pulled it from here took this node's
// state, and the copy is not installed.
func (n *Node) pullKey(ctx context.Context, h uint64, k writeback.Key, lims limits, addr string, mark uint64) {
	s := ownership.NewSettle(n.cfg.GRPCAddr, false)
	from := keymove.Holder{Addr: addr, Release: true}
	if len(lims.more) == 0 {
		s.Add(h, k, from)
	} else {
		for i := range 1 + len(lims.more) {
			s.Add(h, writeback.SubKey(k, i), from)
		}
	}
	for i, got := range n.pullRounds(ctx, s) {
		_, sk := s.Key(i)
		if n.debug {
			n.log.Debug("pulled back", "name", sk.Name, "key", sk.Key, "from", addr, "asked", s.Asked(i), "count", got.State.Count, "version", got.Version)
		}
		if got.Version > 0 {
			n.adoptUncrossed(h, writeback.Record{Key: sk, State: got.State, Version: got.Version}, mark)
		}
	}
}
