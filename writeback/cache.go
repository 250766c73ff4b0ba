package writeback

// The Cache: New, finding a key's slot, single-key Decide, and what the
// flushes and replication read (changed and dirty keys, Len, Stats).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/sluicehq/sluice/bucket"
)

// ErrClosed is returned by calls on a Cache after Close.
var ErrClosed = errors.New("writeback: cache closed")

// ErrFenced is returned by Decide for a key under a fence (Fence: the
// cluster released it to another node), until the fence expires or Install
// or Unfence lifts it.
var ErrFenced = errors.New("writeback: key released to another node")

// Stats are the Cache's counters since New.
type Stats struct {
	Hits           uint64 // Decide, Get and Merge calls that found the key in memory
	Misses         uint64 // calls that did not
	Loads          uint64 // store reads done for misses
	Flushes        uint64 // successful flushes that wrote at least one record
	FlushedRecords uint64 // records written by those flushes
	FlushErrors    uint64 // failed flushes (entries stayed dirty)
	Evictions      uint64 // entries the LRU evicted
	CorruptRecords uint64 // corrupt store records skipped (when the store counts them)
	ExpiredDeleted uint64 // store records deleted by expiry passes
	ExpiryErrors   uint64 // failed expiry passes
}

// Cache is the sharded write-back cache of live counter states.
type Cache struct {
	cfg    Config
	store  Store
	log    *slog.Logger
	shards []*shard
	shift  uint

	closed atomic.Bool
	loadWG sync.WaitGroup // store loads in progress

	flushSem    chan struct{} // held by the one flush in progress
	flushNow    chan struct{} // capacity 1: a shard's pending entries need a flush
	dirtied     chan struct{} // capacity 1: a shard's dirty list became non-empty
	changes     chan struct{} // capacity 1: see Changes
	storeClosed bool          // guarded by flushSem

	life   sync.Mutex // guards cancel and started
	cancel context.CancelFunc
	loops  sync.WaitGroup

	fenceSeq atomic.Uint64 // fences set so far (FenceMark)

	// left counts the slots that left memory (shard.retire), plus one for
	// what the store held when the cache was made: while it differs
	// from clean, its value when a RangeStoredOnly last found every stored
	// key in memory, the store may hold keys memory does not.
	left, clean atomic.Uint64

	flushes, flushedRecords, flushErrors atomic.Uint64
	expiredDeleted, expiryErrors         atomic.Uint64

	// writable is false from a failed flush to the next one that
	// succeeds; health holds the details, for StoreState and the log.
	writable atomic.Bool
	healthMu sync.Mutex
	health   storeHealth
	// downLogged is when a store that stopped taking writes was last
	// logged; guarded by healthMu.
	downLogged time.Time
}

// New returns a Cache over store. It starts no goroutine: see Start.
func New(cfg Config, store Store) (*Cache, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, fmt.Errorf("writeback: nil store")
	}
	c := &Cache{
		cfg:      cfg,
		store:    store,
		log:      cfg.Logger,
		shards:   make([]*shard, cfg.Shards),
		shift:    uint(64 - bits.TrailingZeros(uint(cfg.Shards))),
		flushSem: make(chan struct{}, 1),
		flushNow: make(chan struct{}, 1),
		dirtied:  make(chan struct{}, 1),
		changes:  make(chan struct{}, 1),
	}
	c.writable.Store(true)
	per := cfg.Size / cfg.Shards
	for i := range c.shards {
		s := &shard{pending: map[Key]uint32{}, nameIdx: map[string]uint16{}, fences: map[Key]fence{}, track: cfg.TrackChanges,
			pendingMax: max(per/pendingShare, minPendingMax), kick: c.flushNow, dirtied: c.dirtied, notify: c.changes, takes: 1, left: &c.left}
		if cfg.Partitions > 0 {
			s.byPart, s.partOf, s.slots.linked = map[uint32]uint32{}, cfg.PartitionOf, true
		}
		lru, err := simplelru.NewLRU(per, func(_ uint32, i uint32) { s.onEvict(i) })
		if err != nil {
			return nil, err
		}
		s.lru = lru
		if cfg.Copies > 0 {
			s.copies, err = simplelru.NewLRU(max(cfg.Copies/cfg.Shards, 1), func(_ uint32, i uint32) { s.onEvictCopy(i) })
			if err != nil {
				return nil, err
			}
		}
		c.shards[i] = s
	}
	c.left.Store(1) // the store may hold records, and memory holds none yet
	return c, nil
}

// shardFor picks a shard from the top bits of the caller's hash.
func (c *Cache) shardFor(hash uint64) *shard {
	return c.shards[hash>>c.shift&uint64(len(c.shards)-1)]
}

// find returns k's entry, from memory or the store, with s.mu held on
// return (also on error). With create, a key the store does not hold gets a
// fresh entry; without, it gives nil. A store record whose state is fresh at
// now counts as absent, but its version is kept so that versions keep
// growing.
func (c *Cache) find(s *shard, h uint64, k Key, now int64, create bool) (*slot, error) {
	ch := cacheHash(h, k.Limit)
	s.mu.Lock()
	if s.closed {
		return nil, ErrClosed
	}
	if sl := s.lookup(ch, k, now); sl != nil {
		s.hits++
		return sl, nil
	}
	s.misses++
	c.loadWG.Add(1)
	defer c.loadWG.Done()
	for {
		seq := s.writeSeq
		s.mu.Unlock()
		rec, ok, err := c.store.Load(k)
		s.mu.Lock()
		s.loads++
		switch {
		case err != nil:
			return nil, err
		case s.closed:
			return nil, ErrClosed
		}
		if sl := s.lookup(ch, k, now); sl != nil {
			return sl, nil // loaded by another call meanwhile
		}
		if s.writeSeq != seq {
			continue // a flush completed meanwhile: rec may be stale
		}
		if ok && rec.State.Fresh(now) {
			rec.State = bucket.State{}
			ok = create
		}
		if !ok && !create {
			return nil, nil
		}
		i, sl, err := s.newSlot(h, k, rec.State, rec.Version)
		if err != nil {
			return nil, err
		}
		s.insert(ch, i, now)
		return sl, nil
	}
}

// Decide applies hits against lim to the counter of k at now (Unix
// nanoseconds) and returns the decision. hash is the caller's 64-bit hash of
// k; it picks the shard. A key not in memory is loaded from the store
// (without holding the shard lock) or starts fresh. The error is ErrClosed
// or a store read failure. A hit allocates nothing.
func (c *Cache) Decide(hash uint64, k Key, lim bucket.Limit, hits, now int64) (bucket.Decision, error) {
	return c.DecideLoad(hash, k, &lim, hits, now, 1)
}

// DecideLoad is Decide with the node's load in [0, 1] for elastic limits
// (bucket.DecideLoad). lim is passed by pointer and not kept.
func (c *Cache) DecideLoad(hash uint64, k Key, lim *bucket.Limit, hits, now int64, load float64) (bucket.Decision, error) {
	var d bucket.Decision
	err := c.DecideTo(&d, hash, k, lim, hits, now, load)
	return d, err
}

// DecideTo is DecideLoad writing the decision to *out (see bucket.DecideTo
// for why), for the path of every check. On error *out is not written. A
// limit whose algorithm differs from the live state's is refused with a
// *bucket.AlgorithmConflict and changes nothing (bucket.Conflict).
func (c *Cache) DecideTo(out *bucket.Decision, hash uint64, k Key, lim *bucket.Limit, hits, now int64, load float64) error {
	s := c.shardFor(hash)
	sl, err := c.find(s, hash, k, now, true)
	if err == nil && len(s.fences) > 0 && s.isFenced(k, now) {
		err = ErrFenced
	}
	if err != nil {
		s.mu.Unlock()
		return err
	}
	var st bucket.State
	sl.loadState(&st)
	if st.Algorithm != lim.Algorithm {
		if err := bucket.Conflict(&st, lim, now); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	bucket.DecideTo(out, &st, lim, hits, now, load)
	if sl.differs(&st) {
		sl.setState(st)
		s.changed(hash, sl, now)
	}
	s.mu.Unlock()
	return nil
}

// Refund gives back, at now, hits that k's counter admitted at grantedAt
// under lim and that nobody spent: the unspent part of a quota lease
// (bucket.Refund). A key this cache does not hold, or holds fenced, takes
// nothing back. It returns the hits taken back; the changed counter is
// flushed and replicated like a decision's.
func (c *Cache) Refund(hash uint64, k Key, lim *bucket.Limit, hits, grantedAt, now int64) (int64, error) {
	s := c.shardFor(hash)
	sl, err := c.unfenced(s, hash, k, now, false)
	if sl == nil {
		return 0, err
	}
	var st bucket.State
	sl.loadState(&st)
	back := bucket.Refund(&st, lim, hits, grantedAt, now)
	if back > 0 && sl.differs(&st) {
		sl.setState(st)
		s.changed(hash, sl, now)
	}
	s.mu.Unlock()
	return back, nil
}

// unfenced is find for a change of k other than a decision: it returns
// k's slot with the shard locked, or nil with the lock released and the
// error (ErrFenced for a fenced key; nil when k is not held and not
// created).
func (c *Cache) unfenced(s *shard, hash uint64, k Key, now int64, create bool) (*slot, error) {
	sl, err := c.find(s, hash, k, now, create)
	if err == nil && sl != nil && len(s.fences) > 0 && s.isFenced(k, now) {
		err = ErrFenced
	}
	if err != nil || sl == nil {
		s.mu.Unlock()
		return nil, err
	}
	return sl, nil
}

// Update applies fn to k's state at now, under the lock that serializes
// the key's decisions: fn changes the state in place (a key not held, or
// held fresh, starts from the zero State). A change is flushed and
// replicated like a decision's. A fenced key is ErrFenced, and fn is not
// called. (Concurrency limits: bucket.Acquire, Renew and Release.)
func (c *Cache) Update(hash uint64, k Key, now int64, fn func(*bucket.State)) error {
	s := c.shardFor(hash)
	sl, err := c.unfenced(s, hash, k, now, true)
	if sl == nil {
		return err
	}
	var st bucket.State
	sl.loadState(&st)
	fn(&st)
	if sl.differs(&st) {
		sl.setState(st)
		s.changed(hash, sl, now)
	}
	s.mu.Unlock()
	return nil
}

// Reset forgets k's count at now (bucket.Reset): the next decision is one
// on a fresh counter. The reset state outranks every copy of the count it
// forgot (a newer version, another epoch), and is flushed and replicated
// like a decision. A key this cache does not hold, or holds fresh, is
// left as it is, and Reset reports false; a fenced key is ErrFenced.
func (c *Cache) Reset(hash uint64, k Key, now int64) (bool, error) {
	s := c.shardFor(hash)
	sl, err := c.unfenced(s, hash, k, now, false)
	if sl == nil {
		return false, err
	}
	var st bucket.State
	sl.loadState(&st)
	st = bucket.Reset(st, now)
	changed := sl.differs(&st)
	if changed {
		sl.setState(st)
		s.changed(hash, sl, now)
	}
	s.mu.Unlock()
	return changed, nil
}

// TakeChanged calls fn, without any lock held, with the caller's hash and
// the current record of every key changed by Decide or installed by Install
// since the previous call (with Config.TrackChanges; otherwise it finds
// none). A key that is fresh at now is skipped. The replication of cluster
// sends these records to the keys' replicas.
func (c *Cache) TakeChanged(now int64, fn func(hash uint64, rec Record)) {
	var hs []uint64
	var recs []Record
	for _, s := range c.shards {
		hs, recs = hs[:0], recs[:0]
		s.mu.Lock()
		for _, r := range s.changes {
			if !r.sl.has(changedBit) {
				continue
			}
			r.sl.clear(changedBit)
			if !r.sl.fresh(now) {
				hs = append(hs, r.h)
				recs = append(recs, Record{Key: s.keyOf(r.sl), State: r.sl.state(), Version: r.sl.version})
			}
		}
		if cap(s.changes) <= maxSpare {
			clear(s.changes)
			s.changes = s.changes[:0]
		} else {
			s.changes = nil
		}
		s.takes++
		s.reap()
		s.mu.Unlock()
		for i := range recs {
			fn(hs[i], recs[i])
		}
	}
}

// Changes delivers a value when a key is changed (with
// Config.TrackChanges) while none was waiting for TakeChanged: after a
// receive, some change made since is reported by a later TakeChanged,
// and once TakeChanged has emptied the lists the next change delivers
// again. The replication of cluster waits on it instead of polling.
func (c *Cache) Changes() <-chan struct{} { return c.changes }

// MarkChanged makes the next TakeChanged report k again, if k is in
// memory (a replication that failed keeps its keys this way).
func (c *Cache) MarkChanged(hash uint64, k Key) {
	s := c.shardFor(hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.lookup(cacheHash(hash, k.Limit), k, s.now); sl != nil {
		s.markChanged(hash, sl)
	}
}

// Changed returns the number of keys the next TakeChanged would report
// (at most; fresh ones are skipped).
func (c *Cache) Changed() int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		for _, r := range s.changes {
			if r.sl.has(changedBit) {
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

// Dirty returns the number of entries whose changes are not yet in the
// store (dirty entries in memory and evicted ones waiting for their write).
func (c *Cache) Dirty() int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		for _, sl := range s.dirty {
			if sl.has(queuedBit) {
				n++
			}
		}
		for _, i := range s.pending {
			if sl := s.slots.at(i); !sl.has(queuedBit) && sl.has(dirtyBit) {
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

// Len returns the number of live entries in memory (not counting evicted
// entries waiting in pending for their write).
func (c *Cache) Len() int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		n += s.lru.Len()
		if s.over != nil {
			n += s.over.Len()
		}
		s.mu.Unlock()
	}
	return n
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	st := Stats{
		Flushes:        c.flushes.Load(),
		FlushedRecords: c.flushedRecords.Load(),
		FlushErrors:    c.flushErrors.Load(),
		ExpiredDeleted: c.expiredDeleted.Load(),
		ExpiryErrors:   c.expiryErrors.Load(),
	}
	for _, s := range c.shards {
		s.mu.Lock()
		st.Hits += s.hits
		st.Misses += s.misses
		st.Loads += s.loads
		st.Evictions += s.evictions
		s.mu.Unlock()
	}
	if cc, ok := c.store.(interface{ CorruptRecords() uint64 }); ok {
		st.CorruptRecords = cc.CorruptRecords()
	}
	return st
}
