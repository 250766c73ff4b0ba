package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// This file keeps counts through membership changes (the events replicate,
// push/handoff, pull received and leave of docs/ownership.md):
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

// tableChanged registers what a ring change from old to cur moved to this
// node, before cur becomes current (ownership.Book.TableChanged), and
// reports whether partitions moved away from it (to hand off once cur is
// current).
func (n *Node) tableChanged(old, cur *ring.Table) (lost bool) {
	gained, lost := n.book.TableChanged(old, cur, n.now().UnixNano())
	if gained {
		n.log.Info("partitions moved here; pulling moved keys on first touch", "window", n.cfg.MoveWindow)
	}
	return lost
}

// handoffJob is a table change for the handoff loop: lost, partitions
// moved away (handOffMoved); gained marks the partitions this node owns
// that got a new replica (ownership.ReplicasGained), whose keys go to the next
// replication round.
type handoffJob struct {
	old, cur *ring.Table
	lost     bool
	gained   []bool
	// copyTo names, by partition, the new owner this node's copies of the
	// keys go to (ownership.CopiesFollow, sendCopiesTo); "" for none.
	copyTo []string
}

func (n *Node) handoffLoop() {
	defer n.wg.Done()
	for {
		select {
		case <-n.stop:
			return
		case job := <-n.handoffs:
			n.runHandoff(job)
		}
	}
}

// runHandoff carries out one handoff job.
func (n *Node) runHandoff(job handoffJob) {
	if job.gained != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.HandoffTimeout)
		marked, sent := n.resendToNewReplicas(ctx, job.cur, job.gained, n.now().UnixNano())
		cancel()
		n.log.Debug("new replicas: their keys go to the next replication round", "keys", marked, "stored_keys_sent", sent)
	}
	if job.lost {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.HandoffTimeout)
		n.handOffMoved(ctx, job.old, job.cur)
		cancel()
	}
	if job.copyTo != nil {
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.HandoffTimeout)
		n.sendCopiesTo(ctx, job.cur, job.copyTo)
		cancel()
	}
}

// handOffMoved releases the keys in memory whose partitions moved away from
// this node and pushes them to their new owners: owned → released to X.
func (n *Node) handOffMoved(ctx context.Context, old, cur *ring.Table) {
	now := n.now().UnixNano()
	start := time.Now()
	batches := map[string][]bucket.Counter{}
	copies := map[string][]bucket.Counter{} // sent as replica copies, not handoffs
	moves := n.book.Moves()
	// done is closed once the push is over: a check that would take a
	// released key back waits for it (pushing).
	done := make(chan struct{})
	var hashes []uint64
	defer func() {
		n.pushing.remove(hashes, done)
		close(done)
	}()
	n.rangeHeld(now, n.movedAway(old, cur), func(r writeback.Record, _ bool) bool {
		h := keyHash(r.Key)
		o, _ := old.Owner(h)
		c, ok := cur.Owner(h)
		if !ok || o.Name != n.name || c.Name == n.name {
			return true
		}
		f := n.factsIn(moves, cur, h, r.Key, limits{}, now)
		ev := ownership.Event{Kind: ownership.Lost}
		eff := ownership.Step(f, ev)
		if eff.SendCopy {
			// Unsettled: the new owner pulls it on first touch, and
			// meanwhile holds this copy.
			copies[c.Addr] = append(copies[c.Addr], r.Counter())
			return true
		}
		if !eff.Release {
			return true
		}
		// Fenced only if this node still decides the key: one it had
		// released to another node meanwhile is not handed off
		// (Step(Lost) with Released).
		got := n.carry(h, r.Key, limits{}, eff, change{ttl: n.cfg.MoveWindow, ifDeciding: true}, now)
		if errors.Is(got.err, writeback.ErrFenced) {
			ev.After = ownership.Fenced
			eff = ownership.Step(f, ev)
		}
		if got.err != nil || !got.held || !eff.Push {
			return true
		}
		rec := got.rec
		n.pushing.add(h, done)
		hashes = append(hashes, h)
		if n.debug {
			n.log.Debug("handing off", "name", r.Key.Name, "key", r.Key.Key, "to", eff.NoteTo, "count", rec.State.Count, "version", rec.Version)
		}
		batches[eff.NoteTo] = append(batches[eff.NoteTo], writeback.Record{Key: r.Key, State: rec.State, Version: rec.Version}.Counter())
		return true
	})
	sent, err := n.push(ctx, batches)
	if sent > 0 {
		n.log.Info("handed off moved counters", "counters", sent, "took", time.Since(start))
	}
	if err != nil {
		n.log.Warn("handoff failed; the new owners will pull on first touch", "err", err)
	}
	n.sendCopies(ctx, copies)
}

// movedAway marks the partitions this node owns in old and not in cur.
func (n *Node) movedAway(old, cur *ring.Table) []bool {
	moved := make([]bool, cur.Partitions())
	so, sc := old.Index(n.name), cur.Index(n.name)
	if so < 0 {
		return moved
	}
	for p := range moved {
		c := cur.PartitionOwnerIndex(p)
		moved[p] = old.PartitionOwnerIndex(p) == so && c >= 0 && c != sc
	}
	return moved
}

// sendCopies sends the copies of keys this node lost without having
// settled them (ownership.Effects.SendCopy) to their new owners, as
// replication does, in parallel. A failed send is counted and logged: the
// new owner pulls the key on first touch all the same.
func (n *Node) sendCopies(ctx context.Context, copies map[string][]bucket.Counter) {
	var wg sync.WaitGroup
	for addr, cs := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := n.peers.Replicate(ctx, addr, false, cs); err != nil {
				n.stats.handoffErrors.Add(uint64(len(cs)))
				n.log.Debug("copies not sent", "to", addr, "counters", len(cs), "err", err)
			} else if n.debug {
				n.log.Debug("copies sent", "to", addr, "counters", len(cs))
			}
		}()
	}
	wg.Wait()
}

// push sends batches (by gRPC address) as handoffs, in parallel, and
// returns how many counters the new owners received and, when some did
// not, why.
func (n *Node) push(ctx context.Context, batches map[string][]bucket.Counter) (int, error) {
	var wg sync.WaitGroup
	var sent atomic.Int64
	errs := make(chan error, len(batches))
	for addr, cs := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := n.peers.Replicate(ctx, addr, true, cs); err != nil {
				n.stats.handoffErrors.Add(uint64(len(cs)))
				errs <- fmt.Errorf("%d counters to %s: %w", len(cs), addr, err)
				return
			}
			sent.Add(int64(len(cs)))
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	n.stats.handedOff.Add(uint64(sent.Load()))
	return int(sent.Load()), errors.Join(all...)
}

// replicateLoop runs a replication round at most every
// ReplicationInterval, and only when a counter changed: it sleeps until the
// cache reports a change, then until the next moment of the node's round
// schedule (one interval apart from the loop's start), so a change waits
// at most one interval to be sent, as with a round on every tick, and an
// idle node does not wake. A round never starts at the moment of the
// change that woke it: other changes of that moment (a caller's checks
// one after another, decided here) go in the same round whatever order
// the goroutines ran in, which keeps a simulated run's rounds the seed's
// (cluster/clustertest).
func (n *Node) replicateLoop() {
	defer n.wg.Done()
	every := n.cfg.ReplicationInterval
	start := time.Now()
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-n.cache.Changes():
		}
		t.Reset(nextRound(start, time.Now(), every))
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(every*5, time.Second))
		n.ReplicateNow(ctx) // failures are counted and the keys kept for the next round
		cancel()
	}
}

// nextRound returns how long from now until the first moment after now of
// a schedule of rounds every interval from start.
func nextRound(start, now time.Time, every time.Duration) time.Duration {
	since := now.Sub(start)
	if since < 0 {
		return every
	}
	return every - since%every
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
		c := rec.Counter()
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
				n.stats.replicationErrors.Add(uint64(len(b.counters)))
				for i, c := range b.counters {
					n.cache.MarkChanged(b.hashes[i], writeback.KeyOf(c))
				}
				errs <- fmt.Errorf("replicate %d counters to %s: %w", len(b.counters), addr, err)
				return
			}
			n.stats.replicated.Add(uint64(len(b.counters)))
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
	if handoff && n.draining() {
		// This node is leaving too and has already handed its own counters
		// on: it cannot take these. The sender keeps them in its store.
		return 0, len(counters)
	}
	tbl := n.ring.Table()
	ev := ownership.Event{Kind: ownership.Replicate}
	if handoff {
		// The pusher's address: its table names this node the owner, and
		// this node decides the keys while its own names the pusher.
		ev.Kind, ev.From = ownership.Push, n.addrOf(from)
	}
	moves := n.book.Moves()
	now := n.now().UnixNano()
	for _, c := range counters {
		rec := writeback.RecordOf(c)
		h := keyHash(rec.Key)
		eff := ownership.Step(n.factsIn(moves, tbl, h, rec.Key, limits{}, now), ev)
		// A copy from a node that still believes it owns this key is
		// refused (Stale): the owner's own state is authoritative; a copy
		// never replaces it.
		installed1 := n.carry(h, rec.Key, limits{}, eff, change{rec: rec}, now).installed
		if n.debug && handoff {
			n.log.Debug("handoff received", "name", rec.Key.Name, "key", rec.Key.Key, "from", from, "count", rec.State.Count, "version", rec.Version, "installed", installed1)
		}
		if installed1 {
			installed++
		} else {
			stale++
		}
	}
	return installed, stale
}

// Pull answers another node's pull: the current record of each key, and in
// ans[i] where keys[i] had already been released to and, for a key not
// settled here, the nodes this node would pull it from. With release this
// node stops deciding those keys for ttl, redirecting them to the puller
// (released to the puller). from is the puller's name and fromAddr its
// gRPC address, which the puller sends: this node may not know the puller
// yet (it joined a moment ago), and must still know where the keys went,
// to point their checks there or take them back from there. Without it
// (an older puller), the address is looked up by name. It implements the
// receiving side of Peers.Pull.
func (n *Node) Pull(ctx context.Context, from, fromAddr string, keys []bucket.Counter, release bool, ttl time.Duration, ans []keymove.PullAnswer) {
	now := n.now().UnixNano()
	addr := ""
	if release {
		addr = fromAddr
		if addr == "" {
			addr = n.addrOf(from)
		}
	}
	moves, cur := n.book.Moves(), n.ring.Table()
	for i := range keys {
		k := writeback.KeyOf(keys[i])
		h := keyHash(k)
		var rec writeback.Record
		var ok bool
		var err error
		f := n.factsIn(moves, cur, h, k, limits{}, now)
		if to, ok := n.book.ReleasedTo(k); ok && release && to != addr {
			// A key already released to another node: that node has the
			// newer state; the answer says so, so that the puller asks it
			// too.
			f.ReleasedTo, f.Released = to, n.cache.Fenced(h, k, now)
		}
		eff := ownership.Step(f, ownership.Event{Kind: ownership.Pull, From: addr, Release: release})
		ans[i] = keymove.PullAnswer{MovedTo: eff.MovedTo}
		if eff.Holders {
			ans[i].Holders = n.holders(h, k, cur, addr, now)
		}
		if eff.Release {
			// Released keys are redirected to the puller from now on.
			got := n.carry(h, k, limits{}, eff, change{ttl: ttl}, now)
			rec, ok, err = got.rec, got.held, got.err
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
		if n.debug {
			n.log.Debug("pull answered", "name", k.Name, "key", k.Key, "from", from, "release", eff.Release,
				"count", keys[i].State.Count, "version", keys[i].Version, "moved_to", ans[i].MovedTo, "holders", len(ans[i].Holders))
		}
	}
}

// holders returns the nodes this node would pull k (ring hash h) from
// before deciding it, for the answer to a pull by the node at puller: at
// most keymove.MaxHolders, neither this node nor the puller.
func (n *Node) holders(h uint64, k writeback.Key, cur *ring.Table, puller string, now int64) []keymove.Holder {
	srcs, _ := n.book.Moves().Plan(h, k, n.name, cur, now, nil)
	var hs []keymove.Holder
	for _, s := range srcs {
		if s.Addr != puller && s.Addr != n.cfg.GRPCAddr && len(hs) < keymove.MaxHolders {
			hs = append(hs, s)
		}
	}
	return hs
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

// drain hands every counter this node holds to the keys' next owners, once
// the node is draining (it decides nothing more): it waits for decisions in
// progress, flushes, then pushes the store's live records of the keys it
// owned or replicated in before, its table until it began to drain. A
// record of another key is an old copy, from when this node held the key
// before a ring change took it away: the key's owner and replicas hold a
// newer one, and a next owner that had not settled the key yet would take
// the push as settled and decide from the old count, outranking the newer
// one (seen in a 100-node deploy: 5 hits of one key lost). When before does
// not hold this node (it never entered the ring), every live record is
// pushed. When some were not handed off (ctx ended first, a new owner did
// not answer), it logs how many and where they remain, and returns an
// error that says so.
func (n *Node) drain(ctx context.Context, before *ring.Table) error {
	// A leaving node spends no lease: its checks go to their owners until
	// it stops (docs/leases.md).
	n.leases.Revoke(nil)
	// Decisions hold the gate shared: taking it once waits for those in
	// progress; later ones see draining.
	n.gate.Lock()
	//lint:ignore SA2001 taking the lock is what waits for the decisions in progress
	n.gate.Unlock()
	start := time.Now()
	if err := n.cache.Flush(ctx); err != nil && !errors.Is(err, writeback.ErrClosed) {
		n.log.Error("drain: flush failed; no counter handed off: they remain in memory until Shutdown flushes them, and on their replicas",
			"unflushed", n.cache.Dirty(), "data_dir", n.cfg.DataDir, "err", err)
		return fmt.Errorf("cluster: drain: flush failed, no counter handed off: %w", err)
	}
	tbl := n.ring.Table()
	now := n.now().UnixNano()
	batches := map[string][]bucket.Counter{}
	mine := before != nil && before.Has(n.name)
	var reps []ring.Member
	err := n.cache.RangeStored(now, func(r writeback.Record) bool {
		h := keyHash(r.Key)
		if mine {
			reps = before.Replicas(h, reps[:0])
			if !slices.ContainsFunc(reps, func(m ring.Member) bool { return m.Name == n.name }) {
				return true // an old copy: see above
			}
		}
		o, ok := tbl.Owner(h)
		if ok && o.Name != n.name {
			batches[o.Addr] = append(batches[o.Addr], r.Counter())
		}
		return true
	})
	if err != nil {
		n.log.Error("drain: reading the store failed; no counter handed off: they remain in this node's store and on their replicas",
			"data_dir", n.cfg.DataDir, "err", err)
		return fmt.Errorf("cluster: drain: reading the store failed, no counter handed off: %w", err)
	}
	total := 0
	for _, b := range batches {
		total += len(b)
	}
	sent, perr := n.push(ctx, batches)
	n.log.Info("drained: counters handed to their next owners", "counters", total, "sent", sent, "took", time.Since(start))
	if sent < total {
		// Not lost: the flush above put them in this node's store, which
		// it loads when it starts again, and the replication rounds put
		// them on their replicas, which the new owners pull from on first
		// touch. But this is not the clean stop the caller asked for, and
		// it must be able to tell.
		n.log.Error("drain: counters not handed off; they remain in this node's store, loaded when it starts again, "+
			"and on their replicas as of the last replication round",
			"not_handed_off", total-sent, "counters", total, "data_dir", n.cfg.DataDir, "err", perr)
		return fmt.Errorf("cluster: drain: %d of %d counters not handed off; they remain in this node's store (%s) "+
			"and on their replicas: %w", total-sent, total, n.cfg.DataDir, perr)
	}
	return nil
}

// pushing holds, by ring hash, the keys a handoff has released and whose
// push is still out. A check that would take such a key back (reclaim: a
// stand-in, or a node whose view gives the key back) waits for the push
// first. Without the wait it pulls the key from the new owner before the
// push lands there, finds nothing, and decides from its own count; the
// push then lands with the count from before that decision, the new owner
// adopts it, and the decision is lost (TestReclaimWaitsForThePush; seen
// in CI as an admitted hit no longer counted, in
// TestScaleOutThenInUnderLoad and TestRollingRestartLosesNothing).
type pushing struct {
	mu   sync.Mutex
	keys map[uint64]chan struct{}
}

func (p *pushing) add(h uint64, done chan struct{}) {
	p.mu.Lock()
	if p.keys == nil {
		p.keys = make(map[uint64]chan struct{})
	}
	p.keys[h] = done
	p.mu.Unlock()
}

// remove forgets the hashes of the push that done ends, unless a later
// push took them over.
func (p *pushing) remove(hs []uint64, done chan struct{}) {
	p.mu.Lock()
	for _, h := range hs {
		if p.keys[h] == done {
			delete(p.keys, h)
		}
	}
	p.mu.Unlock()
}

// wait returns once no push of a key with hash h is out, or with ctx's
// error when ctx ends first. A push is bounded by HandoffTimeout.
func (p *pushing) wait(ctx context.Context, h uint64) error {
	for {
		p.mu.Lock()
		done := p.keys[h]
		p.mu.Unlock()
		if done == nil {
			return nil
		}
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendCopiesTo sends the records in memory of the keys whose partitions
// (in tbl) copyTo names a node for to that node, as replica copies: it
// merges them without settling the keys (ownership.Step, Replicate), and
// still pulls each on first touch.
func (n *Node) sendCopiesTo(ctx context.Context, tbl *ring.Table, copyTo []string) {
	batches := map[string][]bucket.Counter{}
	parts := make([]bool, len(copyTo))
	for p, to := range copyTo {
		parts[p] = to != "" && to != n.cfg.GRPCAddr
	}
	n.rangeHeld(n.now().UnixNano(), parts, func(r writeback.Record, _ bool) bool {
		if p := tbl.Partition(keyHash(r.Key)); p < len(copyTo) && copyTo[p] != "" && copyTo[p] != n.cfg.GRPCAddr {
			batches[copyTo[p]] = append(batches[copyTo[p]], r.Counter())
		}
		return true
	})
	n.sendCopies(ctx, batches)
}
