package writeback

// The decision fence, and installs of other nodes' copies (merged, never
// lowering a count). The cache knows nothing of ownership: the cluster's
// ownership component (cluster/ownership) decides when a key is fenced
// (released to another node), to whom, and when it is taken back; the
// fence is here only because it must stop decisions under the lock that
// serialises them, in the same step that reads the record handed over.

import (
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// fence is when a key was fenced (Unix ns), until when, and its place in
// the order of this cache's fences (FenceMark).
type fence struct {
	at, until int64
	seq       uint64
}

// minFenceSweep is the smallest size of a shard's fences at which Fence
// drops the expired ones (shard.fenceSweepAt).
const minFenceSweep = 64

// isFenced reports whether k is fenced at now, forgetting an expired
// fence. s.mu must be held.
func (s *shard) isFenced(k Key, now int64) bool {
	r, ok := s.fences[k]
	if ok && r.until <= now {
		delete(s.fences, k)
		ok = false
	}
	return ok
}

// Fence returns k's current record, like Get, and atomically stops this
// cache from deciding k until now+ttl (Decide answers ErrFenced). The
// cluster fences a key it releases to another node, which gets the
// returned record ("released to" in docs/ownership.md): every change
// Decide made before Fence is in the record, which is the invariant's
// hand-over step.
func (c *Cache) Fence(hash uint64, k Key, now int64, ttl time.Duration) (Record, bool, error) {
	return c.fence(hash, k, now, ttl, false)
}

// fence is Fence; with unlessFenced it refuses (ErrFenced) a key fenced at
// now, checked under the same hold of the lock as the fence itself.
func (c *Cache) fence(hash uint64, k Key, now int64, ttl time.Duration, unlessFenced bool) (Record, bool, error) {
	s := c.shardFor(hash)
	sl, err := c.find(s, hash, k, now, false)
	defer s.mu.Unlock()
	if err != nil {
		return Record{}, false, err
	}
	if unlessFenced && len(s.fences) > 0 && s.isFenced(k, now) {
		return Record{}, false, ErrFenced
	}
	if len(s.fences) >= max(s.fenceSweepAt, minFenceSweep) {
		for mk, r := range s.fences {
			if r.until <= now {
				delete(s.fences, mk)
			}
		}
		s.fenceSweepAt = 2 * len(s.fences)
	}
	s.fences[Key{Name: strings.Clone(k.Name), Key: strings.Clone(k.Key), Limit: k.Limit}] = fence{at: now, until: now + int64(ttl), seq: c.fenceSeq.Add(1)}
	if sl == nil || sl.fresh(now) {
		return Record{}, false, nil
	}
	return Record{Key: k, State: sl.state(), Version: sl.version}, true, nil
}

// FenceIfDeciding is Fence, unless k is fenced at now already: then it
// changes nothing and returns ErrFenced. A node handing a key off to its
// new owner uses it: a key it had released to another node is not its to
// hand off (that node took its state and decides the key), and the check
// must be atomic with the fence.
func (c *Cache) FenceIfDeciding(hash uint64, k Key, now int64, ttl time.Duration) (Record, bool, error) {
	return c.fence(hash, k, now, ttl, true)
}

// Fenced reports whether k is fenced at now.
func (c *Cache) Fenced(hash uint64, k Key, now int64) bool {
	s := c.shardFor(hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.fences) > 0 && s.isFenced(k, now)
}

// Unfence lifts k's fence: this cache decides k again.
func (c *Cache) Unfence(hash uint64, k Key) {
	s := c.shardFor(hash)
	s.mu.Lock()
	delete(s.fences, k)
	s.mu.Unlock()
}

// FenceMark returns a mark of this cache's fences so far: a fence set
// after the call is later than the mark (UnfenceUnlessFencedAfter,
// InstallUnlessFencedAfter). Unlike a time, it orders fences whatever the
// clock said when each was set.
func (c *Cache) FenceMark() uint64 {
	return c.fenceSeq.Load()
}

// UnfenceUnlessFencedAfter lifts k's fence unless it was set after mark
// (FenceMark), and reports whether k is unfenced. A node that takes back a
// key it had released, pulling it from where it went, must not lift a
// fence set while its pull was out: another node pulled the key from it
// meanwhile, took its state, and decides the key now.
func (c *Cache) UnfenceUnlessFencedAfter(hash uint64, k Key, mark uint64) bool {
	s := c.shardFor(hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.fences[k]; ok && r.seq > mark {
		return false
	}
	delete(s.fences, k)
	return true
}

// Install installs rec when it is newer than what is held (or their merge
// changes the state held), like Merge, and then lifts a fence on rec's
// key, reporting whether it did: the cluster adopts a key handed to it. A
// record that changes nothing leaves a fence in force: it is no newer than
// the state this cache released, so the node that took it decides the key
// (TestInstallOfAStaleRecordKeepsTheFence). An installed record counts as
// a change (TakeChanged).
func (c *Cache) Install(hash uint64, rec Record) bool {
	installed, _ := c.install(hash, rec, math.MaxInt64, math.MaxUint64, false)
	return installed
}

// InstallHanded is Install for a record its sender hands over as the
// key's current one (a handoff), and also reports whether the key already
// held that very record (its state and version): a replica copy of it the
// sender made before. Such a handoff installs nothing, yet tells the
// receiver as much as one that did: what it holds is the sender's last
// count. With endRelease (the key was released to the sender, who hands
// it back, or not released) held ends a release as an install does;
// without it a key released here is never held. A held record counts as a
// change, as an installed one does (TakeChanged): the sender replicated it
// to its own replica set, and this node, the key's owner now, sends it to
// its own.
func (c *Cache) InstallHanded(hash uint64, rec Record, endRelease bool) (installed, held bool) {
	return c.install(hash, rec, math.MaxInt64, math.MaxUint64, endRelease)
}

// InstallUnlessFencedSince is Install, except that when the key was fenced
// at or after since (Unix ns) it changes nothing and reports false. A node
// that pulls a key from another (since: when it began) must not lift a
// fence set meanwhile: the node the key was released to took this cache's
// state, and it decides the key now.
func (c *Cache) InstallUnlessFencedSince(hash uint64, rec Record, since int64) bool {
	installed, _ := c.install(hash, rec, since, math.MaxUint64, false)
	return installed
}

// InstallUnlessFencedAfter is Install, except that when the key was fenced
// after mark (FenceMark) it changes nothing and reports false: as
// InstallUnlessFencedSince, with the fence's order in place of its time.
func (c *Cache) InstallUnlessFencedAfter(hash uint64, rec Record, mark uint64) bool {
	installed, _ := c.install(hash, rec, math.MaxInt64, mark, false)
	return installed
}

// Range calls fn with the record of every live key in memory (including
// evicted ones waiting for their write, and replica copies), shard by
// shard, until fn returns false. fn runs without any lock held; a key
// changed meanwhile may be seen before or after its change.
func (c *Cache) Range(now int64, fn func(Record) bool) {
	var recs []Record
	for _, s := range c.shards {
		recs = recs[:0]
		s.mu.Lock()
		add := func(sl *slot) {
			if sl.fresh(now) {
				return
			}
			recs = append(recs, Record{Key: s.keyOf(sl), State: sl.state(), Version: sl.version})
		}
		for _, i := range s.lru.Values() {
			add(s.slots.at(i))
		}
		if s.over != nil {
			for _, i := range s.over.Values() {
				add(s.slots.at(i))
			}
		}
		if s.copies != nil {
			for _, i := range s.copies.Values() {
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

// RangeIn is Range over the keys of the partitions parts marks (nil:
// every key). A cache made with Config.Partitions lists its keys in memory
// by partition and visits only those of the marked partitions, so that
// what a caller pays follows the keys of those partitions, not every key
// in memory. Without Config.Partitions it is Range: fn gets every key, and
// the caller skips the keys of other partitions. Within a shard, the
// partitions come in increasing order.
func (c *Cache) RangeIn(now int64, parts []bool, fn func(Record) bool) {
	if parts == nil || c.cfg.Partitions == 0 {
		c.Range(now, fn)
		return
	}
	var list []uint32
	for p, ok := range parts {
		if ok && p < c.cfg.Partitions {
			list = append(list, uint32(p))
		}
	}
	if len(list) == 0 {
		return
	}
	var recs []Record
	var heads []uint32
	for _, s := range c.shards {
		recs, heads = recs[:0], heads[:0]
		s.mu.Lock()
		if len(list) <= len(s.byPart) {
			for _, p := range list {
				if i, ok := s.byPart[p]; ok {
					heads = append(heads, i)
				}
			}
		} else {
			// The shard lists fewer partitions than are marked: look
			// each of its lists up instead, in increasing order (not
			// the map's).
			for p := range s.byPart {
				if int(p) < len(parts) && parts[p] {
					heads = append(heads, p)
				}
			}
			slices.Sort(heads)
			for j, p := range heads {
				heads[j] = s.byPart[p]
			}
		}
		for _, i := range heads {
			for ; i != 0; i = s.slots.link(i).next {
				if sl := s.slots.at(i); !sl.fresh(now) {
					recs = append(recs, Record{Key: s.keyOf(sl), State: sl.state(), Version: sl.version})
				}
			}
		}
		s.mu.Unlock()
		for _, r := range recs {
			if !fn(r) {
				return
			}
		}
	}
}

// RangeStoredOnly calls fn with every record in the store that is live at
// now and whose key is not in memory, until fn returns false: with Range,
// every key this cache holds once, whether or not it fits in memory. hash
// is the caller's hash of a key (the one it passes to the other calls). A
// key that leaves memory between Range and this call may be seen by both;
// one that comes into memory meanwhile, by neither — but its record is then
// the store's, read by whoever brought it in.
//
// parts, when not nil, says which partitions (Partitioning) the caller
// wants: a store that groups its records by partition (PartitionScanner)
// reads only those, so that what a ring change costs follows what moved,
// not the size of the store; another store is read whole, and fn gets the
// records of other partitions too, which the caller skips.
//
// It reads the store only when a key may have left memory since a call
// last found none there, or the cache was made: once a call that read the
// whole store has found every stored key in memory, a cache whose keys all
// fit costs nothing.
func (c *Cache) RangeStoredOnly(now int64, hash func(Key) uint64, parts []bool, fn func(Record) bool) error {
	if c.closed.Load() {
		return ErrClosed
	}
	left := c.left.Load()
	if left == c.clean.Load() {
		return nil
	}
	given, stopped := 0, false
	each := func(r Record) bool {
		if r.State.Fresh(now) {
			return true // over, for this call's now and every later one
		}
		h := hash(r.Key)
		s := c.shardFor(h)
		s.mu.Lock()
		held := s.holds(cacheHash(h, r.Key.Limit), r.Key)
		s.mu.Unlock()
		if held {
			return true
		}
		given++
		stopped = !fn(r)
		return !stopped
	}
	var err error
	whole := true
	if ps, ok := c.store.(PartitionScanner); ok && parts != nil {
		err, whole = ps.ForEachIn(parts, each), false
	} else {
		err = c.store.ForEach(each)
	}
	if err == nil && whole && given == 0 && !stopped {
		c.clean.Store(left) // a slot that left since has moved left on
	}
	return err
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

// install is InstallUnlessFencedSince and InstallUnlessFencedAfter, and
// InstallHanded's held. (Merge keeps copies apart: mergeCopy.)
func (c *Cache) install(hash uint64, rec Record, since int64, mark uint64, endRelease bool) (installed, held bool) {
	s := c.shardFor(hash)
	// now 0: a stored record counts as absent only when it is the zero state,
	// and an evicted entry is kept for its write unless it is.
	e, err := c.find(s, hash, rec.Key, 0, true)
	defer s.mu.Unlock()
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			c.log.Error("writeback: store read failed; counter not installed", "name", rec.Key.Name, "key", rec.Key.Key, "err", err)
		}
		return false, false
	}
	r, fenced := s.fences[rec.Key]
	if fenced && (r.at >= since || r.seq > mark) {
		return false, false
	}
	if !s.installIn(e, rec) {
		// Nothing newer than the state this cache released: the node it
		// went to decides the key, and may have since (a leaving node
		// pushes its stale replica copies too). The release stands; the
		// cluster takes the key back by pulling it from there. Unless
		// this is the very record held, handed back by the node it was
		// released to (InstallHanded).
		if e.version != rec.Version || e.state() != rec.State || (fenced && !endRelease) {
			return false, false
		}
		// Held: the receiver owns the key now, and its replica set need
		// not be the sender's, which is where the sender replicated the
		// record. So it goes to the next round (TakeChanged) as an
		// installed record does; replicas that have it keep it.
		delete(s.fences, rec.Key)
		s.markChanged(hash, e)
		return false, true
	}
	delete(s.fences, rec.Key)
	s.markChanged(hash, e)
	return true, false
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
