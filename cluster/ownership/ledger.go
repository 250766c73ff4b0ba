package ownership

// The ledger (docs/ownership.md, "After a pause"): which keys this node
// decided lately that another node may own, so that a node that noticed
// a pause can ask its peers which of its keys they decided while it did
// not run, and pull those alone.

import (
	"sync"
	"time"
)

// Ledger records, with the time of the latest, the keys this node decided
// in a role another node may think it holds: as a stand-in, under the
// owner-unavailable policy, or as the new owner of a key a ring change in
// its window brought here (Moves.Brought). A key this node owns and kept
// is not recorded: nobody else decides it while this node runs. It also
// records when this node last took each member out of its ring.
//
// It keeps what happened in the last keep, and at most max keys: when
// full it drops what is older than keep and, when that frees less than
// half, everything; from then on it knows nothing before the drop
// (Since reports it incomplete). Safe for concurrent use.
type Ledger struct {
	keep time.Duration
	max  int

	mu      sync.Mutex
	at      map[uint64]int64 // ring hash → latest decision (Unix ns)
	removed map[string]int64 // member name → when this node last took it out of its ring
	known   int64            // nothing decided before it is recorded: the start, or the last drop
}

// NewLedger returns an empty ledger of a node started at start (Unix ns)
// that keeps keep of history and at most room keys (at least 2).
func NewLedger(keep time.Duration, room int, start int64) *Ledger {
	return &Ledger{keep: keep, max: max(room, 2), at: map[uint64]int64{}, removed: map[string]int64{}, known: start}
}

// Keep returns how far back the ledger reaches.
func (l *Ledger) Keep() time.Duration { return l.keep }

// Note records a decision at now of the key with ring hash h.
func (l *Ledger) Note(h uint64, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.at[h]; !ok && len(l.at) >= l.max {
		l.prune(now)
	}
	if l.at[h] < now {
		l.at[h] = now
	}
}

// Removed records that this node took the member name out of its ring at now.
func (l *Ledger) Removed(name string, now int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.removed) >= l.max {
		l.prune(now)
	}
	l.removed[name] = now
}

// prune drops what is older than keep; when the keys still fill more than
// half the room, it drops them all. l.mu is held.
func (l *Ledger) prune(now int64) {
	old := now - int64(l.keep)
	for h, t := range l.at {
		if t < old {
			delete(l.at, h)
		}
	}
	for name, t := range l.removed {
		if t < old {
			delete(l.removed, name)
		}
	}
	l.known = max(l.known, old)
	if len(l.at) > l.max/2 {
		clear(l.at)
		l.known = now
	}
	if len(l.removed) > l.max/2 {
		clear(l.removed)
		l.known = now
	}
}

// Since appends to dst the ring hashes of the keys decided at or after t
// (Unix ns) for which want reports true, and returns them. complete
// reports whether the ledger knows everything from t to now (t is not
// before the node's start, the last drop, or keep before now); removed,
// whether this node took the member name out of its ring at or after t.
func (l *Ledger) Since(t, now int64, name string, want func(h uint64) bool, dst []uint64) (hs []uint64, complete, removed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for h, at := range l.at {
		if at >= t && want(h) {
			dst = append(dst, h)
		}
	}
	rt, ok := l.removed[name]
	return dst, t >= l.known && t >= now-int64(l.keep), ok && rt >= t
}
