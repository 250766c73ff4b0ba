package ownership

// A settle of a batch of keys a ring change moved here (docs/ownership.md:
// unsettled → pulling → owned): whom each key is pulled from, round by
// round, what the answers tell, and at the end which keys are settled and
// which stay unsettled. The node carries out the pulls and merges the
// copies they bring; every decision about them is taken here.

import (
	"slices"

	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback/key"
)

// MaxPullRounds bounds the rounds of pulls of a Settle: the nodes its plan
// names, then one round of the nodes their answers name (moved_to,
// holders) and, for an owner's settle, of the nodes whose pull failed.
// Each round is bounded by the node's pull timeout, and two of them (200
// ms by default) fit in a forward's deadline (250 ms), which a node
// settling a forwarded check must answer within.
const MaxPullRounds = 2

// Settle is one settle of a batch of keys. Made by NewSettle, filled by Add
// and Plan, driven by Next, Failed and Answered until Next returns no
// pull, and ended by Finish. Not safe for concurrent use.
type Settle struct {
	self  string // this node's gRPC address
	owner bool   // the checks are decided by this node as the keys' owner
	round int    // rounds handed out by Next
	keys  []settling
}

// settling is one key of a Settle and what its pulls found.
type settling struct {
	h     uint64
	k     key.Key
	asked []keymove.Holder // nodes asked, deduplicated by address
	moves Moves            // the moves it is settled for
	// unanswered holds the addresses whose last pull of the key failed;
	// answered counts the answers that tell something of the key: a copy,
	// or, from a node asked to release it (its previous owner), that there
	// is none. An empty answer from a node asked without release (a
	// replica of the key in this node's table, which may not have received
	// it yet) tells nothing.
	unanswered []string
	answered   int
	next       []nextAsk // whom to ask in the coming round
}

// nextAsk is a node to ask in the coming round, and whether only because
// its pull failed (asked again only when the settle retries and the
// caller's deadline leaves time).
type nextAsk struct {
	to    keymove.Holder
	retry bool
}

// PullCall is one call of a round: the keys (indices into the Settle) to pull
// from one node, with or without release.
type PullCall struct {
	To   keymove.Holder
	Keys []int
}

// NewSettle returns an empty settle for the node at gRPC address self. An
// owner's settle (owner set: the checks are decided by this node as the
// keys' owner) asks a node whose pull failed again when there is time, and
// leaves unsettled a key that no node told anything of while one that did
// not answer is still a member (Finish). A stand-in's or a failover's
// settle is the fallback already: its keys are settled once the pulls are
// done, answered or not, as a side of a partition settles them.
func NewSettle(self string, owner bool) *Settle {
	return &Settle{self: self, owner: owner}
}

// Add adds key k (ring hash h), to be pulled from asked (may be empty: see
// Plan), and returns its index.
func (s *Settle) Add(h uint64, k key.Key, asked ...keymove.Holder) int {
	s.keys = append(s.keys, settling{h: h, k: k, asked: slices.Clone(asked)})
	return len(s.keys) - 1
}

// Len returns the number of keys.
func (s *Settle) Len() int { return len(s.keys) }

// Key returns key i and its ring hash.
func (s *Settle) Key(i int) (uint64, key.Key) { return s.keys[i].h, s.keys[i].k }

// Asked returns the number of nodes key i was to be pulled from: its
// plan and the nodes the answers named (the last round's are named but
// not pulled).
func (s *Settle) Asked(i int) int { return len(s.keys[i].asked) }

// Plan adds to every key the nodes ms.Plan names for it (self is this
// node's name, cur its current table) and the moves it settles.
func (s *Settle) Plan(ms Moves, self string, cur *ring.Table, now int64) {
	for i := range s.keys {
		sk := &s.keys[i]
		sk.asked, sk.moves = ms.Plan(sk.h, sk.k, self, cur, now, sk.asked)
	}
}

// Next returns the pulls of the coming round, one per node and release
// flag, or nil when the settle's pulls are done: the first round asks
// every key's planned nodes; the next ones, up to MaxPullRounds in all,
// the nodes the answers named (Answered) and, for an owner's settle when
// timeLeft (the caller's deadline leaves time for one more pull and a
// decision after it), the nodes whose pull failed.
func (s *Settle) Next(timeLeft bool) []PullCall {
	if s.round >= MaxPullRounds {
		return nil
	}
	first := s.round == 0
	s.round++
	var pulls []PullCall
	for i := range s.keys {
		sk := &s.keys[i]
		var to []keymove.Holder
		if first {
			to = sk.asked
		} else {
			for _, a := range sk.next {
				if !a.retry || s.owner && timeLeft {
					to = append(to, a.to)
				}
			}
		}
		sk.next = sk.next[:0]
		for _, h := range to {
			j := slices.IndexFunc(pulls, func(p PullCall) bool { return p.To == h })
			if j < 0 {
				pulls = append(pulls, PullCall{To: h})
				j = len(pulls) - 1
			}
			pulls[j].Keys = append(pulls[j].Keys, i)
		}
	}
	return pulls
}

// Failed records that p failed: an error, or no answer within its
// deadline. Its node is asked again in the next round when Next allows.
func (s *Settle) Failed(p PullCall) {
	for _, i := range p.Keys {
		sk := &s.keys[i]
		if !slices.Contains(sk.unanswered, p.To.Addr) {
			sk.unanswered = append(sk.unanswered, p.To.Addr)
		}
		sk.next = append(sk.next, nextAsk{to: p.To, retry: true})
	}
}

// Answered records p's answers: copies[j] whether the node held a copy of
// key p.Keys[j] (a version above 0), ans[j] what else it said of it. A node
// the answer names as holding a newer state (where the key had been
// released to, or the holders the answering node would have pulled it
// from) is asked in the next round (Follow).
func (s *Settle) Answered(p PullCall, copies []bool, ans []keymove.PullAnswer) {
	for j, i := range p.Keys {
		sk := &s.keys[i]
		sk.unanswered = slices.DeleteFunc(sk.unanswered, func(a string) bool { return a == p.To.Addr })
		if p.To.Release || copies[j] {
			sk.answered++
		}
		follow := func(addr string, release bool) {
			if src, ok := Follow(sk.asked, addr, release, s.self); ok {
				sk.asked = append(sk.asked, src)
				sk.next = append(sk.next, nextAsk{to: src})
			}
		}
		follow(ans[j].MovedTo, true)
		for _, h := range ans[j].Holders {
			follow(h.Addr, h.Release)
		}
	}
}

// Deferral is a key Finish left unsettled for want of an answer: its
// index, and a member that did not answer its pull.
type Deferral struct {
	Key    int
	Member string
}

// Finish ends the settle once the copies the pulls brought are installed.
// When the caller gave up (cancelled), no key is settled: its pulls may
// have failed for that reason alone, and the next touch asks again.
// Otherwise every key is settled for its moves, except, in an owner's
// settle, a key that no node asked told anything of while one that did not
// answer is still a member of cur (and not every one of its moves is a
// pause's): that member (its previous owner, slow to answer on a loaded
// machine) may hold the newest count, and this node's own copy may be
// minutes old. Such keys are returned; their checks must not be decided
// here now.
//
// A node asked that is no longer a member handed its counters on when it
// left, or its replicas hold them. A pause's moves never leave a key
// unsettled: a starved node's own slowness makes its pulls time out, and
// deferring its checks would add work where it has least; the pause's own
// guarantee covers the keys others decided meanwhile.
func (s *Settle) Finish(cur *ring.Table, cancelled bool) []Deferral {
	if cancelled {
		return nil
	}
	var deferred []Deferral
	for i := range s.keys {
		sk := &s.keys[i]
		if s.owner && sk.answered == 0 && !sk.moves.PauseOnly() {
			if addr, ok := memberOf(cur, sk.unanswered); ok {
				deferred = append(deferred, Deferral{Key: i, Member: addr})
				continue
			}
		}
		settled(sk.k, sk.moves)
	}
	return deferred
}

// PauseOnly reports whether ms holds moves and every one is a pause's.
func (ms Moves) PauseOnly() bool {
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
