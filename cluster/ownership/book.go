package ownership

// The records (docs/ownership.md, "The records"): moves with their
// settled sets, and where released keys went. Every record has a bound:
// a move stops applying at the end of its window and is dropped by the
// next move or Sweep; a released-to record is dropped once the cache no
// longer holds the key's release; a handed record when the key is released
// or its move window ends.

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback/key"
)

// Move is one recent ring change that gave this node partitions: keys of
// those partitions are pulled from their holders under Prev on first touch.
type Move struct {
	prev  *ring.Table
	until int64 // Unix ns; no pulls after it
	// cur is set when this node entered the ring with this change (a start
	// or a restart): the key's replicas in cur may hold newer counts than
	// the previous owner, because they stood in for this node while it was
	// unreachable and the others had not yet declared it dead.
	cur *ring.Table
	// owned limits the move to the keys this node owns in cur: set after
	// a pause (Paused), where the node's ring did not change and only the
	// keys it owns were decided elsewhere.
	owned bool
	// since, on a pause move, is when the earliest gap it stands for
	// began (Unix ns, this node's clock): others may have decided its
	// keys from then on.
	since int64
	// only, once set (Narrow), limits a pause move to the keys with these
	// ring hashes: the ones its peers said they decided since since.
	only    atomic.Pointer[map[uint64]struct{}]
	settled sync.Map // key.Key → struct{}: pulled or handed over
}

// Since returns when the earliest gap a pause move stands for began
// (Unix ns); 0 for a move of a ring change.
func (m *Move) Since() int64 { return m.since }

// Cur returns the ring table a pause move limits itself to (the keys the
// node owns in it).
func (m *Move) Cur() *ring.Table { return m.cur }

// Pause reports whether the move is a pause's (Paused) rather than a ring
// change's.
func (m *Move) Pause() bool { return m.owned }

// applies reports whether m brought the key with ring hash h to self.
func (m *Move) applies(h uint64, self string) bool {
	if prev, ok := m.prev.Owner(h); !ok || prev.Name == self {
		return false
	}
	if m.owned {
		if o, ok := m.cur.Owner(h); !ok || o.Name != self {
			return false
		}
		if only := m.only.Load(); only != nil {
			if _, ok := (*only)[h]; !ok {
				return false
			}
		}
	}
	return true
}

// Moves is a snapshot of the node's moves, newest first.
type Moves []*Move

// Book holds one node's ownership records. It is safe for concurrent use.
type Book struct {
	self   string // the node's name in ring tables
	window time.Duration
	// released reports whether the cache still holds a release of k at
	// now: a released-to record is kept only while it does.
	released func(k key.Key, now int64) bool

	moves   atomic.Pointer[Moves]
	movesMu sync.Mutex // held by the writers of moves

	releasedTo sync.Map // key.Key → gRPC address of the node that took it
	// handed holds the keys pushed here by a handoff and not released
	// since: key.Key → handed. handedN counts its entries (roughly: a
	// check of a key it does not own skips the map while it is 0).
	handed  sync.Map
	handedN atomic.Int64
	// stores counts noteReleased calls since the last prune of releasedTo,
	// sweepAt is the count that starts the next one, and pruning lets one
	// prune run at a time.
	stores, sweepAt atomic.Int64
	pruning         sync.Mutex
}

// NewBook returns the records of the node named self, whose moves apply
// for window (MoveWindow) after their change. released reports whether
// the node's cache still holds a release of a key (writeback's
// Cache.Released): it must not block.
func NewBook(self string, window time.Duration, released func(k key.Key, now int64) bool) *Book {
	return &Book{self: self, window: window, released: released}
}

// Moves returns the node's current moves (nil when there are none).
func (b *Book) Moves() Moves {
	if ms := b.moves.Load(); ms != nil {
		return *ms
	}
	return nil
}

// add makes m the newest move, dropping those whose window ended before now.
func (b *Book) add(m *Move, now int64) {
	b.movesMu.Lock()
	defer b.movesMu.Unlock()
	ms := Moves{m}
	for _, old := range b.Moves() {
		if old.until > now {
			ms = append(ms, old)
		}
	}
	b.moves.Store(&ms)
}

// TableChanged reads a ring change from old to cur, before cur becomes
// the node's table: when it gives this node partitions that another node
// owned, it registers a move (the table-change event: those keys become
// unsettled). It reports whether the change gave partitions here (gained)
// and whether it took some away (lost: the node hands them off once cur
// is current). A joining node's old table is the cluster's table without
// it; the move then also pulls the keys' current replicas (Move.cur).
func (b *Book) TableChanged(old, cur *ring.Table, now int64) (gained, lost bool) {
	if cur.Len() <= 1 && old.Len() <= 1 {
		return false, false
	}
	// By member number, not name: this walks every partition on every
	// event.
	so, sc := old.Index(b.self), cur.Index(b.self)
	for p := 0; p < cur.Partitions() && !(gained && lost); p++ {
		o, c := old.PartitionOwnerIndex(p), cur.PartitionOwnerIndex(p)
		gained = gained || (sc >= 0 && c == sc && o >= 0 && o != so)
		lost = lost || (so >= 0 && o == so && c >= 0 && c != sc)
	}
	if gained {
		m := &Move{prev: old, until: now + int64(b.window)}
		if !HasMember(old, b.self) && HasMember(cur, b.self) {
			m.cur = cur
		}
		b.add(m, now)
	}
	return gained, lost
}

// Paused registers the move of a noticed pause that began at since (Unix
// ns): prev is the ring without this node (which the others used when
// they declared it dead), cur the current one; it applies to the keys
// this node owns in cur only. It replaces the pause moves over the same
// cur: the new one applies to the same keys for longer, none of them is
// settled for it yet, and it stands for their gaps too (its since is the
// earliest), so the older ones add nothing. However often a starved node
// notices a pause, its book holds one pause move per table. It returns
// the new move, for Narrow.
func (b *Book) Paused(prev, cur *ring.Table, now, since int64) *Move {
	b.movesMu.Lock()
	defer b.movesMu.Unlock()
	m := &Move{prev: prev, cur: cur, owned: true, until: now + int64(b.window), since: since}
	ms := Moves{m}
	for _, old := range b.Moves() {
		switch {
		case old.until <= now:
		case old.owned && old.cur == cur:
			m.since = min(m.since, old.since)
		default:
			ms = append(ms, old)
		}
	}
	b.moves.Store(&ms)
	return m
}

// Narrow limits the pause move m to the keys with the ring hashes in
// only: its peers said that of the keys this node owns, they decided
// those alone since m.Since() (the event "pause answered"). It reports
// false, and changes nothing, when m is no longer in the book (a newer
// pause replaced it, or its window ended) or was narrowed already. The
// caller gives up only.
func (b *Book) Narrow(m *Move, only map[uint64]struct{}) bool {
	b.movesMu.Lock()
	defer b.movesMu.Unlock()
	if !m.owned || m.only.Load() != nil || !slices.Contains(b.Moves(), m) {
		return false
	}
	m.only.Store(&only)
	return true
}

// HasMember reports whether name is a member of t.
func HasMember(t *ring.Table, name string) bool { return t.Has(name) }

// Unsettled reports whether some move in its window at now brought the
// key k (ring hash h) here and k has not been settled for it since.
func (ms Moves) Unsettled(h uint64, k key.Key, self string, now int64) bool {
	for _, m := range ms {
		if now > m.until || !m.applies(h, self) {
			continue
		}
		_, done := m.settled.Load(k)
		return !done
	}
	return false
}

// Unsettled is Moves.Unsettled for the book's current moves.
func (b *Book) Unsettled(h uint64, k key.Key, now int64) bool {
	return b.Moves().Unsettled(h, k, b.self, now)
}

// Brought reports whether a ring change in its window at now brought the
// key with ring hash h to self (a pause's move does not count): self
// decides it while the node that owned it before may not know yet. Such
// decisions go into the Ledger.
func (ms Moves) Brought(h uint64, self string, now int64) bool {
	for _, m := range ms {
		if !m.owned && now <= m.until && m.applies(h, self) {
			return true
		}
	}
	return false
}

// Active reports whether some move is still within its window at now.
func (ms Moves) Active(now int64) bool {
	for _, m := range ms {
		if now <= m.until {
			return true
		}
	}
	return false
}

// Carried records in the book what the effects eff of an event on key k,
// now carried out by the node, change there: the release of k to
// eff.NoteTo (Release), and, for a handoff the node installed, that no
// move pulls k again (MarkSettled). The node changes the book through
// events only: TableChanged, Paused, Narrow, Sweep, a Settle's Finish and
// this (TestOnlyEventsWriteTheBook).
func (b *Book) Carried(k key.Key, eff Effects, now int64) {
	if eff.Release {
		b.forgetHanded(k)
		if eff.NoteTo != "" {
			b.noteReleased(k, eff.NoteTo, now)
		}
	}
	if eff.HandedFrom != "" {
		b.noteHanded(k, eff.HandedFrom, now)
	}
	if eff.MarkSettled {
		b.markSettled(k)
	}
}

// handed is the record of a key pushed here: by whom, and until when it
// counts (Unix ns).
type handed struct {
	from  string
	until int64
}

// noteHanded records that the node at from handed k here at now: for the
// move window, or until this node releases k, its table named this node
// the key's owner (Facts.HandedBy).
func (b *Book) noteHanded(k key.Key, from string, now int64) {
	if _, loaded := b.handed.Swap(CloneKey(k), handed{from: from, until: now + int64(b.window)}); !loaded {
		b.handedN.Add(1)
	}
}

// forgetHanded drops k's handed record: this node released k.
func (b *Book) forgetHanded(k key.Key) {
	if b.handedN.Load() == 0 {
		return
	}
	if _, loaded := b.handed.LoadAndDelete(k); loaded {
		b.handedN.Add(-1)
	}
}

// HandedBy returns the address of the node that handed k here by a push,
// when this node has not released k since and the move window that began
// with the push has not ended at now; "" otherwise.
func (b *Book) HandedBy(k key.Key, now int64) string {
	if b.handedN.Load() == 0 {
		return ""
	}
	v, ok := b.handed.Load(k)
	if !ok {
		return ""
	}
	if h := v.(handed); h.until >= now {
		return h.from
	}
	return ""
}

// HandedRecords returns how many handed records the book holds.
func (b *Book) HandedRecords() int { return int(b.handedN.Load()) }

// markSettled records that k arrived by handoff: no move pulls it again.
func (b *Book) markSettled(k key.Key) {
	ms := b.Moves()
	if len(ms) == 0 {
		return
	}
	k = CloneKey(k)
	for _, m := range ms {
		m.settled.Store(k, struct{}{})
	}
}

// settled records that k was pulled for the moves ms (those Plan returned).
func settled(k key.Key, ms Moves) {
	if len(ms) == 0 {
		return
	}
	k = CloneKey(k)
	for _, m := range ms {
		m.settled.Store(k, struct{}{})
	}
}

// MinReleasedSweep is the fewest noteReleased calls between two prunes of
// the released-to records.
const MinReleasedSweep = 1024

// noteReleased records that this node released k (at now) to the node at
// addr. The record matters only while the cache holds the release, so
// every max(MinReleasedSweep, twice the records kept by the last prune)
// calls it drops the records of keys no longer released: the records stay
// within about twice the releases in force instead of growing with every
// key ever moved, at O(1) per call, amortised.
func (b *Book) noteReleased(k key.Key, addr string, now int64) {
	b.releasedTo.Store(CloneKey(k), addr)
	if b.stores.Add(1) < max(b.sweepAt.Load(), MinReleasedSweep) || !b.pruning.TryLock() {
		return
	}
	defer b.pruning.Unlock()
	b.prune(now)
}

// ReleasedTo returns the address k was last released to, if recorded.
func (b *Book) ReleasedTo(k key.Key) (string, bool) {
	v, ok := b.releasedTo.Load(k)
	if !ok {
		return "", false
	}
	return v.(string), true
}

// ReleasedRecords returns how many released-to records the book holds
// (for tests and the status page's accounting).
func (b *Book) ReleasedRecords() int {
	n := 0
	b.releasedTo.Range(func(_, _ any) bool { n++; return true })
	return n
}

// prune drops the released-to records of keys no longer released at now
// and sets the next prune at twice the records kept. b.pruning is held.
func (b *Book) prune(now int64) {
	b.stores.Store(0)
	var kept int64
	b.releasedTo.Range(func(k, _ any) bool {
		if b.released(k.(key.Key), now) {
			kept++
		} else {
			b.releasedTo.Delete(k)
		}
		return true
	})
	b.sweepAt.Store(2 * kept)
	if b.handedN.Load() > 0 {
		b.handed.Range(func(k, v any) bool {
			if v.(handed).until < now {
				if _, loaded := b.handed.LoadAndDelete(k); loaded {
					b.handedN.Add(-1)
				}
			}
			return true
		})
	}
}

// Sweep forgets what membership changes left behind (the window-end
// event): the moves whose window ended before now, with their settled
// sets, and the released-to records of keys no longer released.
func (b *Book) Sweep(now int64) {
	b.movesMu.Lock()
	if cur := b.Moves(); cur != nil {
		var ms Moves
		for _, m := range cur {
			if m.until >= now {
				ms = append(ms, m)
			}
		}
		switch {
		case len(ms) == 0:
			b.moves.Store(nil)
		case len(ms) < len(cur):
			b.moves.Store(&ms)
		}
	}
	b.movesMu.Unlock()
	b.pruning.Lock()
	defer b.pruning.Unlock()
	b.prune(now)
}

// CloneKey returns k with its own copies of the strings, for a record that
// outlives the request k came from.
func CloneKey(k key.Key) key.Key {
	return key.Key{Name: strings.Clone(k.Name), Key: strings.Clone(k.Key), Limit: k.Limit}
}
