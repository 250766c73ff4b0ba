package writeback

// Copies of keys this node does not decide (replica copies, Merge): they
// never take a place in the LRU of the keys this node decides.
//
// A copy of a key the cache does not hold in memory gets a slot in the
// shard's copies LRU (Config.Copies), apart from the LRU: the next flush
// writes it, and it stays in memory, so that the owner's next copy of the
// key (a replica gets one for every change, within the replication
// interval) is installed in place without a read of the store. The
// oldest copy makes room: dropped when written, else kept in pending
// until its write. Without a copies LRU (Copies 0), or when another
// copy's hash takes the place, the slot goes to pending, as if the LRU
// had evicted it before its write: the next flush writes it and drops it,
// and from then on only the store holds it.
//
// A read of the key (Decide, Get: a replica standing in for its owner, a
// pull) finds it in copies or pending, or loads it from the store like
// any evicted key, and only then does it take a place in the LRU. So the
// cache's Size counts the keys this node decides, and copies cost at most
// Copies entries of memory besides. A copy of a key the cache holds is
// installed in place, without making it more recent.

import (
	"errors"

	"github.com/sluicehq/sluice/bucket"
)

// holds reports whether k (LRU key ch) is in memory: decided here, a copy,
// or evicted and waiting for its write. It changes no LRU's order.
func (s *shard) holds(ch uint32, k Key) bool {
	if i, ok := s.lru.Peek(ch); ok && s.is(s.slots.at(i), k) {
		return true
	}
	if s.over != nil && s.over.Contains(k) {
		return true
	}
	if s.copies != nil {
		if i, ok := s.copies.Peek(ch); ok && s.is(s.slots.at(i), k) {
			return true
		}
	}
	_, ok := s.pending[k]
	return ok
}

// peek finds k in memory without changing its place: in the LRU, the
// overflow LRU, pending, or as a copy (which it makes the most recent
// copy).
func (s *shard) peek(ch uint32, k Key) *slot {
	if i, ok := s.lru.Peek(ch); ok {
		if sl := s.slots.at(i); s.is(sl, k) {
			return sl
		}
	}
	if s.over != nil && s.over.Len() > 0 {
		if i, ok := s.over.Peek(k); ok {
			return s.slots.at(i)
		}
	}
	if s.copies != nil {
		if i, ok := s.copies.Peek(ch); ok {
			if sl := s.slots.at(i); s.is(sl, k) {
				s.copies.Get(ch)
				return sl
			}
		}
	}
	if i, ok := s.pending[k]; ok {
		return s.slots.at(i)
	}
	return nil
}

// mergeCopy is Merge: it installs rec in the slot held in memory, or, for a
// key held only in the store or nowhere, in a new slot in pending.
func (c *Cache) mergeCopy(hash uint64, rec Record) bool {
	s := c.shardFor(hash)
	ch := cacheHash(hash, rec.Key.Limit)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if sl := s.peek(ch, rec.Key); sl != nil {
		s.hits++
		return s.installIn(sl, rec)
	}
	s.misses++
	c.loadWG.Add(1)
	defer c.loadWG.Done()
	for {
		seq := s.writeSeq
		s.mu.Unlock()
		stored, ok, err := c.store.Load(rec.Key)
		s.mu.Lock()
		s.loads++
		switch {
		case err != nil:
			if errors.Is(err, ErrClosed) {
				return false
			}
			c.log.Error("writeback: store read failed; counter not installed", "name", rec.Key.Name, "key", rec.Key.Key, "err", err)
			return false
		case s.closed:
			return false
		}
		if sl := s.peek(ch, rec.Key); sl != nil {
			return s.installIn(sl, rec) // loaded or merged by another call meanwhile
		}
		if s.writeSeq != seq {
			continue // a flush completed meanwhile: stored may be stale
		}
		if !ok {
			stored = Record{}
		} else if stored.State.Fresh(0) {
			stored.State = bucket.State{} // as in install: only the zero state counts as absent
		}
		st, v, ok := installed(stored.State, stored.Version, rec)
		if !ok {
			return false
		}
		i, sl, err := s.newSlot(hash, rec.Key, st, v)
		if err != nil {
			c.log.Error("writeback: counter not installed", "name", rec.Key.Name, "err", err)
			return false
		}
		s.queue(sl)
		if s.copies != nil && !s.copies.Contains(ch) {
			s.copies.Add(ch, i) // may evict the oldest copy (onEvictCopy)
			return true
		}
		s.pending[s.keyOf(sl)] = i
		s.kickIfPendingFull()
		return true
	}
}

// installIn installs rec in sl (see installed) and queues it for the next
// flush, reporting whether it changed anything.
func (s *shard) installIn(sl *slot, rec Record) bool {
	held := sl.state()
	st, v, ok := installed(held, sl.version, rec)
	if !ok {
		return false
	}
	if st != held {
		sl.setState(st)
	}
	sl.version = v
	s.queue(sl)
	return true
}
