package cluster

// After a pause, ask instead of pulling everything (docs/ownership.md,
// "After a pause").
//
// A node that noticed a pause registers a move for every key it owns
// (pause.go): each is pulled on first touch, for a move window. That is
// safe, but on a starved machine pauses come again and again, and each
// one sends every key touched in the next 30 s through a pull: the pulls
// are more work for a machine that has too little CPU already.
//
// Yet only the keys somebody else decided while the node did not run need
// a pull, and the deciders know which: every node records in its Ledger
// the keys it decided as a stand-in, under the owner-unavailable policy,
// or as the new owner of a key a ring change brought it, and which
// members it took out of its ring. So, once the forwards that were in
// flight when the node ran again have ended (twice the forward timeout:
// one for the forward, one for its stand-in), the node asks every member
// of its ring once which of its partitions' keys they decided since the
// gap began (Peer/Decided), and narrows the pause's move to those keys
// (Book.Narrow). Keys touched before the answers are pulled as before.
//
// It narrows nothing, and every key is pulled as before, when any member
// does not answer, answers that its record does not reach back so far,
// or took this node out of its ring in that time (the others then
// decided its keys as their owners and may still do: the pulls release
// them there), or when the gap began longer ago than a move window (a
// new owner records its decisions only for its move window). A check
// that a sender gave up on while this node did not answer, and that a
// stand-in decided after the answers, is the slow owner's case
// (docs/guarantees.md: stand-in decisions are not merged back).
//
// One round runs at a time, and rounds start at least pauseQueryEvery
// apart: on a machine that starves the node again and again, a round is
// one small call per member at most once a second, however many pauses.
// And a node asks only when the pulls it made since the pause, at their
// pace, would come to more calls than a round over the move window
// (worthAsking); an idle node, or one with a trickle of checks, pulls as
// before.

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
)

// DecidedPeers is a Peers that can ask a member which keys it decided
// lately (Peer/Decided). A node whose Peers does not implement it pulls
// every key it owns after a pause.
type DecidedPeers interface {
	Decided(ctx context.Context, addr string, within time.Duration, count int, partitions []uint32) (keymove.DecidedAnswer, error)
}

// Bounds of the pause queries and the ledger that answers them.
const (
	// pauseQueryEvery is the least time between the starts of two rounds.
	pauseQueryEvery = time.Second
	// pauseQueryTimeout bounds a round. A starved machine answers slowly,
	// and keys are pulled on first touch while the round runs, so a late
	// answer still spares the pulls of the rest of the move window.
	pauseQueryTimeout = 5 * time.Second
	// pauseQueryWidth is the most members asked at once.
	pauseQueryWidth = 16
	// ledgerRoom is the most keys a node's ledger holds (16 bytes each
	// and a map's overhead: a few MB at most). A node that decides more
	// keys than that in a ledger's keep as a stand-in or new owner
	// answers that its record is incomplete.
	ledgerRoom = 1 << 17
)

// ledgerKeep is how far back a node's ledger reaches: a move window (a
// pause is narrowed only when it began within one) and the time a round
// may wait and take.
func ledgerKeep(cfg *Config) time.Duration {
	return cfg.MoveWindow + 4*cfg.ForwardTimeout + 10*time.Second
}

// noteDecided records a decision d of r at now, of the key with ring hash
// h, made here: among the heaviest keys (hitters), and in the ledger when
// another node may think the key its own: this node does not own it (a
// stand-in, the owner-unavailable policy), or a ring change in its window
// brought it here.
func (n *Node) noteDecided(h uint64, r *check.Request, d *bucket.Decision, owns bool, now int64) {
	n.hitters.Note(h, r.Name, r.Key, r.Hits, d.Allowed(), now)
	if !owns || n.book.Moves().Brought(h, n.name, now) {
		n.ledger.Note(h, now)
	}
}

// Decided answers a member that noticed a pause (Peer/Decided): the keys
// of its partitions (of a ring of count) this node decided in the last
// within in a role the asker may think its own, and whether this node
// took it out of its ring in that time.
func (n *Node) Decided(_ context.Context, from string, within time.Duration, count int, partitions []uint32) keymove.DecidedAnswer {
	now := n.now().UnixNano()
	tbl := n.ring.Table()
	if tbl.Partitions() != count {
		return keymove.DecidedAnswer{}
	}
	asked := make([]bool, count)
	for _, p := range partitions {
		asked[p] = true
	}
	hs, complete, removed := n.ledger.Since(now-int64(within), now, from,
		func(h uint64) bool { return asked[tbl.Partition(h)] }, nil)
	return keymove.DecidedAnswer{Hashes: hs, Complete: complete, Removed: removed}
}

// askAfterPause wakes the pause query loop for the pause move m.
func (n *Node) askAfterPause(m *ownership.Move, noticed time.Time) {
	n.pause.askMu.Lock()
	n.pause.asked, n.pause.noticed, n.pause.pulls = m, noticed, n.stats.pulls.Load()
	n.pause.askMu.Unlock()
	select {
	case n.pause.wake <- struct{}{}:
	default:
	}
}

// pauseQueryLoop runs the rounds of askAfterPause, one at a time, each
// 2 × ForwardTimeout after its pause was noticed and pauseQueryEvery
// after the last one began.
func (n *Node) pauseQueryLoop() {
	defer n.wg.Done()
	var last time.Time
	for {
		select {
		case <-n.stop:
			return
		case <-n.pause.wake:
		}
		n.pause.askMu.Lock()
		m, noticed, pulls0 := n.pause.asked, n.pause.noticed, n.pause.pulls
		n.pause.askMu.Unlock()
		if m == nil {
			continue
		}
		start := noticed.Add(2 * n.cfg.ForwardTimeout)
		if !last.IsZero() {
			start = later(start, last.Add(pauseQueryEvery))
		}
		if d := time.Until(start); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-n.stop:
				t.Stop()
				return
			case <-t.C:
			}
		}
		if !n.worthAsking(m, time.Since(noticed), n.stats.pulls.Load()-pulls0) {
			continue
		}
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), pauseQueryTimeout)
		n.queryPause(ctx, m)
		cancel()
	}
}

// worthAsking reports whether a round of questions for the pause move m
// costs less than the pulls it may spare: a round is one call per other
// member of m's table, and the pulls go on at the pace of the first ones,
// pulls in elapsed since the pause was noticed, until the move's window
// ends. A node that pulled little (an idle spell, a trickle of checks)
// pulls on: at 100 members, a round after every pause of every node of a
// starved machine would be 10,000 calls a second, more work than the
// pulls, and more work for the machine is how an overload feeds itself.
func (n *Node) worthAsking(m *ownership.Move, elapsed time.Duration, pulls uint64) bool {
	others := float64(m.Cur().Len() - 1)
	projected := float64(pulls) * n.cfg.MoveWindow.Seconds() / max(elapsed.Seconds(), 1e-3)
	if projected >= others {
		return true
	}
	n.stats.pauseQueriesSkipped.Add(1)
	return false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// queryPause asks every other member of the pause move m's ring which of
// this node's keys it decided since the gap began, and narrows m to those
// keys when every one answered completely (the event "pause answered").
// It reports whether it narrowed m.
func (n *Node) queryPause(ctx context.Context, m *ownership.Move) bool {
	dp, ok := n.peers.(DecidedPeers)
	if !ok {
		n.stats.pauseQueriesKept.Add(1)
		return false
	}
	cur := m.Cur()
	// The span asked about ends at each member's now when it answers,
	// which may be up to the round's timeout after this node asks (an
	// answer later than that is not used): it must still reach back to
	// the gap's start, with a forward timeout to spare.
	within := time.Duration(n.now().UnixNano()-m.Since()) + n.cfg.ForwardTimeout + pauseQueryTimeout
	if within > n.cfg.MoveWindow {
		// Too long ago for the new owners' records (see the file's doc).
		n.stats.pauseQueriesKept.Add(1)
		return false
	}
	count := cur.Partitions()
	var mine []uint32
	for p := range count {
		if o, ok := cur.PartitionOwner(p); ok && o.Name == n.name {
			mine = append(mine, uint32(p))
		}
	}
	var others []ring.Member
	for _, mb := range cur.Members() {
		if mb.Name != n.name {
			others = append(others, mb)
		}
	}
	var (
		mu     sync.Mutex
		only   = map[uint64]struct{}{}
		failed string // why the answers do not do, when they do not
		wg     sync.WaitGroup
		sem    = make(chan struct{}, pauseQueryWidth)
	)
	for _, mb := range others {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			a, err := dp.Decided(ctx, mb.Addr, within, count, mine)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case failed != "":
			case err != nil:
				failed = mb.Name + ": " + err.Error()
			case a.Removed:
				failed = mb.Name + " took this node out of its ring"
			case !a.Complete:
				failed = mb.Name + "'s record does not reach back to the gap"
			default:
				for _, h := range a.Hashes {
					only[h] = struct{}{}
				}
			}
		}()
	}
	wg.Wait()
	if failed != "" {
		n.stats.pauseQueriesKept.Add(1)
		n.log.Debug("after a pause: every owned key is pulled", "why", failed, "within", within)
		return false
	}
	if !n.book.Narrow(m, only) {
		return false // a newer pause replaced m: its own round follows
	}
	n.stats.pauseQueriesNarrowed.Add(1)
	n.log.Debug("after a pause: only the keys the members decided are pulled", "keys", len(only), "members", len(others), "within", within)
	return true
}
