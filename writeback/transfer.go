package writeback

// Keys that move between nodes: releases, adoption of another node's copy
// (merged, never lowering a count), and installs.

import (
	"errors"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// release is when a key was released (Unix ns) and until when.
type release struct{ at, until int64 }

// minMovedSweep is the smallest size of a shard's releases at which
// Release drops the expired ones (shard.movedSweepAt).
const minMovedSweep = 64

// isMoved reports whether k is released at now, forgetting an expired
// release. s.mu must be held.
func (s *shard) isMoved(k Key, now int64) bool {
	r, ok := s.moved[k]
	if ok && r.until <= now {
		delete(s.moved, k)
		ok = false
	}
	return ok
}

// Release returns k's current record, like Get, and atomically stops this
// cache from deciding k until now+ttl (Decide answers ErrMoved): the key now
// belongs to another node, which got the returned record (the key is
// "released to" it, in docs/ownership.md). Every change Decide made before
// Release is in the record: this is the invariant's hand-over step.
func (c *Cache) Release(hash uint64, k Key, now int64, ttl time.Duration) (Record, bool, error) {
	s := c.shardFor(hash)
	sl, err := c.find(s, hash, k, now, false)
	defer s.mu.Unlock()
	if err != nil {
		return Record{}, false, err
	}
	if len(s.moved) >= max(s.movedSweepAt, minMovedSweep) {
		for mk, r := range s.moved {
			if r.until <= now {
				delete(s.moved, mk)
			}
		}
		s.movedSweepAt = 2 * len(s.moved)
	}
	s.moved[Key{Name: strings.Clone(k.Name), Key: strings.Clone(k.Key), Limit: k.Limit}] = release{at: now, until: now + int64(ttl)}
	if sl == nil || sl.fresh(now) {
		return Record{}, false, nil
	}
	return Record{Key: k, State: sl.state(), Version: sl.version}, true, nil
}

// Released reports whether k is released at now.
func (c *Cache) Released(hash uint64, k Key, now int64) bool {
	s := c.shardFor(hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.moved) > 0 && s.isMoved(k, now)
}

// Reclaim makes this cache decide k again (this node owns it again).
func (c *Cache) Reclaim(hash uint64, k Key) {
	s := c.shardFor(hash)
	s.mu.Lock()
	delete(s.moved, k)
	s.mu.Unlock()
}

// Adopt takes ownership of rec's key: it ends a release of the key and
// installs rec when it is newer than what is held, like Merge, reporting
// whether it did. An installed record counts as a change (TakeChanged).
func (c *Cache) Adopt(hash uint64, rec Record) bool {
	return c.install(hash, rec, math.MaxInt64)
}

// AdoptUnlessReleasedSince is Adopt, except that when this cache released
// the key at or after since (Unix ns) it changes nothing and reports false.
// A node that pulls a key from another (since: when it began) must not end
// a release that happened meanwhile: the node the key went to took this
// cache's state, and it decides the key now.
func (c *Cache) AdoptUnlessReleasedSince(hash uint64, rec Record, since int64) bool {
	return c.install(hash, rec, since)
}

// Range calls fn with the record of every live key in memory (including
// evicted ones waiting for their write), shard by shard, until fn returns
// false. fn runs without any lock held; a key changed meanwhile may be
// seen before or after its change.
func (c *Cache) Range(now int64, fn func(Record) bool) {
	var recs []Record
	for _, s := range c.shards {
		recs = recs[:0]
		s.mu.Lock()
		add := func(sl *slot) {
			if !sl.fresh(now) {
				recs = append(recs, Record{Key: s.keyOf(sl), State: sl.state(), Version: sl.version})
			}
		}
		for _, i := range s.lru.Values() {
			add(s.slots.at(i))
		}
		if s.over != nil {
			for _, i := range s.over.Values() {
				add(s.slots.at(i))
			}
		}
		for _, i := range s.pending {
			add(s.slots.at(i))
		}
		s.mu.Unlock()
		for _, r := range recs {
			if !fn(r) {
				return
			}
		}
	}
}

// RangeStored calls fn with every record in the store that is live at now,
// until fn returns false. Call Flush first for the store to hold every
// change made so far.
func (c *Cache) RangeStored(now int64, fn func(Record) bool) error {
	if c.closed.Load() {
		return ErrClosed
	}
	return c.store.ForEach(func(r Record) bool {
		if r.State.Fresh(now) {
			return true
		}
		return fn(r)
	})
}

// Get returns the current record of k, loading it from the store on a miss.
// A counter that is fresh at now (never hit, or expired) is absent.
func (c *Cache) Get(hash uint64, k Key, now int64) (Record, bool, error) {
	s := c.shardFor(hash)
	sl, err := c.find(s, hash, k, now, false)
	defer s.mu.Unlock()
	if err != nil || sl == nil || sl.fresh(now) {
		return Record{}, false, err
	}
	return Record{Key: k, State: sl.state(), Version: sl.version}, true, nil
}

// Merge installs rec when its Version is newer than the one held in memory
// or in the store, and marks it dirty: a copy of a key this node does not
// decide (a replica's). A key not in memory stays out of the LRU: the copy
// waits in memory only for the next flush (see replica.go). It reports whether it installed rec;
// a store read failure is logged and reported as false. For the algorithms
// bucket.Merge has a rule for (fixed window, GCRA, leaky bucket, sliding
// log), it installs the merge of both copies instead, whatever their
// versions: the counter never becomes less strict than either copy, and
// the version becomes at least rec's.
func (c *Cache) Merge(hash uint64, rec Record) bool {
	return c.mergeCopy(hash, rec)
}

// install is AdoptUnlessReleasedSince. (Merge keeps copies apart: mergeCopy.)
func (c *Cache) install(hash uint64, rec Record, since int64) bool {
	s := c.shardFor(hash)
	// now 0: a stored record counts as absent only when it is the zero state,
	// and an evicted entry is kept for its write unless it is.
	e, err := c.find(s, hash, rec.Key, 0, true)
	defer s.mu.Unlock()
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			c.log.Error("writeback: store read failed; counter not installed", "name", rec.Key.Name, "key", rec.Key.Key, "err", err)
		}
		return false
	}
	if r, ok := s.moved[rec.Key]; ok && r.at >= since {
		return false
	}
	delete(s.moved, rec.Key)
	if !s.installIn(e, rec) {
		return false
	}
	s.markChanged(hash, e)
	return true
}

// installed returns the state and version a key holding (held, version)
// has once rec is installed, and false when rec changes nothing.
func installed(held bucket.State, version uint64, rec Record) (bucket.State, uint64, bool) {
	st, merged := bucket.Merge(held, rec.State)
	switch {
	case !merged && rec.Version <= version:
		return held, version, false
	case !merged:
		st = rec.State
	case st == held && rec.Version <= version:
		return held, version, false // nothing the held copy has not seen
	}
	// A merge is never less strict than either copy (bucket.Merge): the
	// other copy may be newer by the clock and still have seen fewer hits
	// (the other side of a healed partition). The version grows with any
	// change of state and reaches the installed one, so that replicas
	// holding either copy take the merge.
	if st != held {
		return st, max(version+1, rec.Version), true
	}
	return st, max(version, rec.Version), true
}
