package ownership

// Whom to pull an unsettled key from (docs/ownership.md: unsettled →
// pulling), and where to look next when an answer says the key had moved on.

import (
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback/key"
)

// Plan appends to srcs the nodes to pull key k (ring hash h) from before
// self decides it, each marked whether to release the key there, and
// returns them with the moves k is settled for once they answered (none
// when no move applies or k is settled). cur is self's current table. For each move in its window that brought k here
// and has not settled it, it asks:
//   - the previous owner, releasing the key there (so it stops deciding it);
//   - the previous owner's replicas, without releasing: a replica that stood
//     in for it while it was unreachable holds newer counts than it does
//     (it may have restarted from a stale store);
//   - when neither the previous owner nor any of its replicas is in cur
//     (the other side of a partition, or several crashes), every other
//     member, without releasing: the members left may each have decided
//     the key from their own cache meanwhile, reaching neither holder
//     (--on-owner-unavailable=serve), and they do not own it;
//   - when self entered the ring with the change (a start or a restart),
//     the key's current replicas, releasing it there: they may have stood
//     in for self while it was unreachable, and from now on stand-in
//     checks should come here;
//   - the key's current replicas in cur otherwise, without releasing: a
//     check self could not settle before (no node asked answered) failed
//     over to the first of them, which decided it as a stand-in, and that
//     decision must not be lost when self settles the key. Usually they
//     are asked already (a join's previous owner is the key's first
//     replica after it; a leaver's replicas are its successor's).
//
// A node asked for several reasons is asked once, releasing when any
// reason says so.
func (ms Moves) Plan(h uint64, k key.Key, self string, cur *ring.Table, now int64, srcs []keymove.Holder) ([]keymove.Holder, Moves) {
	var settles Moves
	var reps []ring.Member
	for _, m := range ms {
		if now > m.until || !m.applies(h, self) {
			continue
		}
		if _, done := m.settled.Load(k); done {
			break
		}
		settles = append(settles, m)
		prev, _ := m.prev.Owner(h)
		srcs = Ask(srcs, prev.Addr, true)
		reps = m.prev.Replicas(h, reps[:0])
		held := HasMember(cur, prev.Name)
		for _, r := range reps[min(1, len(reps)):] {
			held = held || HasMember(cur, r.Name)
			if r.Name != self && r.Name != prev.Name {
				srcs = Ask(srcs, r.Addr, false)
			}
		}
		if !held {
			for _, mb := range cur.Members() {
				if mb.Name != self {
					srcs = Ask(srcs, mb.Addr, false)
				}
			}
		}
		if m.cur != nil {
			reps = m.cur.Replicas(h, reps[:0])
			for _, r := range reps {
				if r.Name != self && r.Name != prev.Name {
					srcs = Ask(srcs, r.Addr, true)
				}
			}
		}
	}
	if len(settles) > 0 {
		for _, r := range cur.Replicas(h, reps[:0]) {
			if r.Name != self {
				srcs = Ask(srcs, r.Addr, false)
			}
		}
	}
	return srcs, settles
}

// Ask adds addr to srcs, or makes an existing entry release when release is
// set.
func Ask(srcs []keymove.Holder, addr string, release bool) []keymove.Holder {
	for j := range srcs {
		if srcs[j].Addr == addr {
			srcs[j].Release = srcs[j].Release || release
			return srcs
		}
	}
	return append(srcs, keymove.Holder{Addr: addr, Release: release})
}

// Asks reports whether addr is among srcs.
func Asks(srcs []keymove.Holder, addr string) bool {
	for _, s := range srcs {
		if s.Addr == addr {
			return true
		}
	}
	return false
}

// Follow is the pulls-answered event for one answer that names another
// node that may hold a newer state of the key: the node the answerer had
// released it to (moved_to, with release), or a node the answerer would
// have pulled it from itself (a holder). That node is asked too, unless
// it is self (selfAddr) or was asked already as this asks it: a node asked
// without release (a replica of the previous owner, in this node's older
// table) that the answer names as where the key went is asked again with
// release, or it would go on deciding the key beside this node.
func Follow(srcs []keymove.Holder, addr string, release bool, selfAddr string) (keymove.Holder, bool) {
	if addr == "" || addr == selfAddr {
		return keymove.Holder{}, false
	}
	for _, s := range srcs {
		if s.Addr == addr && (s.Release || !release) {
			return keymove.Holder{}, false
		}
	}
	return keymove.Holder{Addr: addr, Release: release}, true
}
