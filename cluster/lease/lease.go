// Package lease holds the records of quota leases for hot keys
// (docs/leases.md): on a key's owner, how fast each other node sends it a
// key's checks (Heat) and how big a slice to grant (Size, TTL); on the node
// that holds a lease, the slices it may still spend (Table).
//
// A grant is an admission: the owner decides Size hits of the key's limit
// at once, as one request of that many hits would, and hands them to the
// sender with a lifetime. The holder spends them on its own checks of the
// key until the lifetime ends. Every hit a holder admits was therefore
// admitted by the owner's algorithm first, in the same window (TTL ends a
// lease at the window's end): a limit stays as exact as its algorithm on
// the owner. Tokens left when a lease ends are not admitted by anyone; that
// is the scheme's under-admission, which Size keeps to about one lifetime
// of the holder's traffic.
//
// Like cluster/ownership, the package does no I/O, starts no goroutine and
// reads no clock: time comes in as now (Unix nanoseconds).
package lease

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// Leasable reports whether hits against lim may be decided from a lease:
// a single hard limit of the token bucket, the fixed window (not a
// calendar one) or the sliding-window counter (without sub-windows), and
// at least one hit. The others stay with the owner on every check: the
// sliding log and GCRA/leaky bucket remember when each hit came, soft and
// elastic modes and counted refusals depend on the owner's state at the
// moment of the check, and a peek (hits 0) consumes nothing to lease.
func Leasable(lim *bucket.Limit, hits int64) bool {
	if hits < 1 || lim.Limit < 1 || lim.Mode != bucket.ModeHard || lim.CountRefused || lim.Shaping {
		return false
	}
	switch lim.Algorithm {
	case bucket.TokenBucket:
		return true
	case bucket.FixedWindow:
		return lim.Calendar == bucket.CalendarNone
	case bucket.SlidingWindow, bucket.AlgorithmUnspecified:
		return lim.SubWindows <= 1
	}
	return false
}

// TTL returns how long a lease granted at now (the owner's clock) may be
// spent: at most max, and for the windowed algorithms no later than the
// end of the window now is in (windows are aligned to the epoch), so every
// leased hit is spent in the window whose count holds it. 0 means grant
// nothing: less than a millisecond of the window is left.
func TTL(lim *bucket.Limit, now int64, max time.Duration) time.Duration {
	ttl := max
	if lim.Algorithm != bucket.TokenBucket && now >= 0 && lim.WindowMS > 0 {
		w := lim.WindowMS * int64(time.Millisecond)
		ttl = min(ttl, time.Duration(w-now%w))
	}
	if ttl < time.Millisecond {
		return 0
	}
	return ttl
}

// RefusalTTL returns how long a refusal lease may last for a check the
// owner refused with retryAfterMS, when a lease would last ttl (TTL: at
// most a lifetime, never past the window's end): the algorithm's state
// only grows stricter until it would admit again, so the refusal holds
// until then. retryAfterMS is rounded up to the millisecond; one
// millisecond less is always before the real time. 0: none.
func RefusalTTL(retryAfterMS int64, ttl time.Duration) time.Duration {
	if retryAfterMS <= 1 || ttl <= 0 {
		return 0
	}
	return min(time.Duration(retryAfterMS-1)*time.Millisecond, ttl)
}

// MaxTokens is the most hits one lease carries.
const MaxTokens = 1 << 20

// Size returns how many hits to lease to a node that sends the key's
// checks at rate hits per second, for ttl, when the owner's algorithm has
// remaining hits left after the check it just decided: what the node
// would spend in the lease's lifetime — or twice its previous lease, when
// it spent that one early (spent > 0, Heat.Observe) — and never more than
// half of what is left, so that the owner and the other holders keep the
// rest. 0 means grant nothing.
func Size(rate float64, ttl time.Duration, remaining, spent int64) int64 {
	if !(rate > 0) || ttl <= 0 || remaining < 2 {
		return 0
	}
	want := max(math.Ceil(rate*ttl.Seconds()), 2*float64(spent))
	s := min(remaining/2, MaxTokens)
	if want < float64(s) {
		s = int64(want)
	}
	return max(s, 0)
}

// Grant is a lease as it travels with an answer from a key's owner to the
// node that forwarded the check (check.Outcome.Lease): Tokens hits to
// spend for TTL after that node sent the check. The holder measures TTL
// from before the owner decided, on its own clock, so it never spends past
// the owner's end.
type Grant = check.Lease

// A Grant of 0 tokens is a refusal lease: the owner refused the check and
// its algorithm refuses as many hits or more until TTL after the holder
// sent it (the answer's retry-after, at most a lease's lifetime), so the
// holder may refuse them itself until then (Table.Take).

// Valid reports whether g is a lease a holder may keep: 0 (a refusal) to
// MaxTokens hits, for a positive time of at most maxTTL.
func Valid(g Grant, maxTTL time.Duration) bool {
	return g.Tokens >= 0 && g.Tokens <= MaxTokens && g.TTL > 0 && g.TTL <= maxTTL
}

// Key names what a lease is for: the key and the limit it was granted
// under. A check of the same key under another limit (a rule changed) does
// not spend it.
type Key struct {
	Name, Key string
	Limit     bucket.Limit
}

// MaxSlices is how many leases of one key a holder keeps at once: several
// of its checks may find the last one spent and each come back with a
// grant.
const MaxSlices = 4

type slice struct {
	tokens    int64
	expires   int64 // Unix ns on the holder's clock
	resetAt   int64 // Unix ns: the owner's ResetAfterMS at the grant
	grantedAt int64 // the grant's id (owner's clock); 0: it cannot be returned
}

// Return is the unspent part of a lease, which its holder gives back to
// the key's owner (Peer/Return) once it can no longer spend it: the
// lease ended, or a newer one pushed it out. GrantedAt is the grant's id.
type Return struct {
	Key       Key
	Hits      int64
	GrantedAt int64
}

// MaxReturns is how many returns a Table keeps until they are sent
// (TakeReturns); more are counted unused and dropped.
const MaxReturns = 4096

type entry struct {
	slices []slice // soonest expiry first
	// A refusal lease: checks of refuseHits or more are refused until
	// refuseUntil (Unix ns on the holder's clock); 0 none.
	refuseUntil, refuseHits, refuseResetAt int64
}

// live reports whether e still holds anything at now.
func (e *entry) live(now int64) bool { return len(e.slices) > 0 || e.refuseUntil > now }

// Table is a node's leases: for each key, the slices it holds. Safe for
// concurrent use.
type Table struct {
	mu sync.Mutex
	m  map[Key]*entry
	// n is len(m), also read without the lock to skip the table when it
	// is empty (the common case).
	n       atomic.Int64
	stats   Stats
	returns []Return
}

// Stats counts what a Table did.
type Stats struct {
	Granted   uint64 // leases put
	Tokens    uint64 // hits in them
	Decisions uint64 // checks decided from a lease
	Spent     uint64 // hits spent
	Unused    uint64 // hits left when a lease ended, expired or was dropped
	Returning uint64 // of those, hits put up for return to the owner (TakeReturns)
	Revoked   uint64 // leases dropped before their end (Revoke)
	Refusals  uint64 // refusal leases put
	Refused   uint64 // checks refused from a refusal lease
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{m: map[Key]*entry{}}
}

// Len returns the number of keys with a lease.
func (t *Table) Len() int {
	return int(t.n.Load())
}

// Put adds a lease of g for k, granted with the answer to a check of hits
// sent at sent (the holder's clock); resetAfterMS is the owner's answer's.
// An invalid grant is not kept (Put reports false). When k already holds
// MaxSlices slices, the one that ends first is dropped, its tokens counted
// unused. A refusal lease (0 tokens) replaces k's previous one.
func (t *Table) Put(k Key, g Grant, hits, sent int64, resetAfterMS int64, maxTTL time.Duration) bool {
	if !Valid(g, maxTTL) || hits < 1 {
		return false
	}
	resetAt := sent + resetAfterMS*int64(time.Millisecond)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		e = &entry{}
		t.m[k] = e
		t.n.Add(1)
	}
	t.prune(k, e, sent)
	if g.Tokens == 0 {
		e.refuseUntil, e.refuseHits, e.refuseResetAt = sent+int64(g.TTL), hits, resetAt
		t.stats.Refusals++
		return true
	}
	sl := slice{tokens: g.Tokens, expires: sent + int64(g.TTL), resetAt: resetAt, grantedAt: g.GrantedAt}
	if len(e.slices) == MaxSlices {
		t.ended(k, e.slices[0])
		e.slices = e.slices[1:]
	}
	i := len(e.slices)
	for i > 0 && e.slices[i-1].expires > sl.expires {
		i--
	}
	e.slices = append(e.slices, slice{})
	copy(e.slices[i+1:], e.slices[i:])
	e.slices[i] = sl
	t.stats.Granted++
	t.stats.Tokens += uint64(g.Tokens)
	return true
}

// ended counts the hits left in k's slice s, which its holder no longer
// spends, as unused, and puts them up for return.
func (t *Table) ended(k Key, s slice) {
	if s.tokens <= 0 {
		return
	}
	t.stats.Unused += uint64(s.tokens)
	if s.grantedAt != 0 && len(t.returns) < MaxReturns {
		t.returns = append(t.returns, Return{Key: k, Hits: s.tokens, GrantedAt: s.grantedAt})
		t.stats.Returning += uint64(s.tokens)
	}
}

// TakeReturns appends the returns waiting to be sent to dst, and forgets
// them.
func (t *Table) TakeReturns(dst []Return) []Return {
	t.mu.Lock()
	defer t.mu.Unlock()
	dst = append(dst, t.returns...)
	clear(t.returns)
	t.returns = t.returns[:0]
	return dst
}

// prune drops k's slices that ended by now or are spent.
func (t *Table) prune(k Key, e *entry, now int64) {
	j := 0
	for _, s := range e.slices {
		switch {
		case s.tokens == 0:
		case s.expires <= now:
			t.ended(k, s)
		default:
			e.slices[j] = s
			j++
		}
	}
	clear(e.slices[j:])
	e.slices = e.slices[:j]
}

// Take spends hits of k's leases at now, from the slice that ends first,
// and returns the decision to answer with: allowed, Remaining the hits
// still leased for k. When no slice holds hits but a live refusal lease
// covers them, the decision is that refusal (over the limit, retry when it
// ends). ok is false, and nothing is spent, otherwise: the check goes to
// the owner.
func (t *Table) Take(k Key, hits, now int64, d *bucket.Decision) (ok bool) {
	if t.n.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		return false
	}
	t.prune(k, e, now)
	at := -1
	for i := range e.slices {
		if e.slices[i].tokens >= hits {
			at = i
			break
		}
	}
	if at < 0 {
		if e.refuseUntil > now && hits >= e.refuseHits {
			const msNS = int64(time.Millisecond)
			*d = bucket.Decision{Status: bucket.OverLimit, Limit: k.Limit.Limit,
				ResetAfterMS: max((e.refuseResetAt-now+msNS-1)/msNS, 0), RetryAfterMS: max((e.refuseUntil-now+msNS-1)/msNS, 1)}
			t.stats.Refused++
			return true
		}
		if !e.live(now) {
			delete(t.m, k)
			t.n.Add(-1)
		}
		return false
	}
	s := &e.slices[at]
	s.tokens -= hits
	left := int64(0)
	for _, x := range e.slices {
		left += x.tokens
	}
	*d = bucket.Decision{Status: bucket.UnderLimit, Limit: k.Limit.Limit, Remaining: left,
		ResetAfterMS: max((s.resetAt-now+int64(time.Millisecond)-1)/int64(time.Millisecond), 0)}
	t.stats.Decisions++
	t.stats.Spent += uint64(hits)
	return true
}

// Left returns the hits k's live slices hold at now.
func (t *Table) Left(k Key, now int64) int64 {
	if t.n.Load() == 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	if e == nil {
		return 0
	}
	left := int64(0)
	for _, s := range e.slices {
		if s.expires > now {
			left += s.tokens
		}
	}
	return left
}

// Refusing reports whether k has a live refusal lease at now.
func (t *Table) Refusing(k Key, now int64) bool {
	if t.n.Load() == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.m[k]
	return e != nil && e.refuseUntil > now
}

// Sweep drops every slice that ended by now, and keys left with none.
func (t *Table) Sweep(now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.m {
		t.prune(k, e, now)
		if !e.live(now) {
			delete(t.m, k)
			t.n.Add(-1)
		}
	}
}

// Revoke drops the leases of the keys moved reports (every lease when
// moved is nil: this node leaves) and returns how many it dropped. A ring
// change revokes the leases of the keys whose owner it changed, and no
// others: the owner of the rest still counts their grants. Their tokens
// count as unused, and are not returned: the owner forgets its grants of
// the keys that moved (Heat.ForgetGrants), and a leaving node's returns
// would reach it after it stopped deciding the keys. moved is called with
// the table's lock held and must not call back into it.
func (t *Table) Revoke(moved func(Key) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, e := range t.m {
		if moved != nil && !moved(k) {
			continue
		}
		for _, s := range e.slices {
			t.stats.Unused += uint64(s.tokens)
			n++
		}
		if e.refuseUntil != 0 {
			n++ // a refusal lease
		}
		delete(t.m, k)
		t.n.Add(-1)
	}
	t.stats.Revoked += uint64(n)
	return n
}

// Stats returns the table's counts so far.
func (t *Table) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}
