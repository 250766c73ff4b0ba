package writeback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/sluicehq/sluice/bucket"
)

// ErrClosed is returned by calls on a Cache after Close.
var ErrClosed = errors.New("writeback: cache closed")

// ErrMoved is returned by Decide for a key that Release handed to another
// node, until the release expires or Adopt or Reclaim takes the key back.
var ErrMoved = errors.New("writeback: key released to another node")

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

// entry is the live state of one key. It is reached from exactly one of a
// shard's LRU or its pending map; flushes and the dirty list hold pointers to
// it. Every field is guarded by the shard's mutex.
// The flag and the flushed version share a word so that an entry with a
// 48-byte State is exactly 64 bytes, an allocation size class.
type entry struct {
	state   bucket.State
	version uint64 // bumped by every change
	// meta is the highest version known to be in the store, with
	// queuedBit set while the entry is referenced from shard.dirty.
	// Versions follow Unix nanoseconds and stay below 2^63 until 2262.
	meta uint64
}

const queuedBit = 1 << 63

func (e *entry) flushed() uint64 { return e.meta &^ queuedBit }
func (e *entry) queued() bool    { return e.meta&queuedBit != 0 }

func (e *entry) setFlushed(v uint64) { e.meta = e.meta&queuedBit | v&^queuedBit }

func (e *entry) setQueued(q bool) {
	if q {
		e.meta |= queuedBit
	} else {
		e.meta &^= queuedBit
	}
}

// dirty reports whether the entry has changes the store does not hold yet.
func (e *entry) dirty() bool { return e.version > e.flushed() }

// dirtyRef is one entry waiting for the next flush.
type dirtyRef struct {
	key Key
	e   *entry
}

// maxNames bounds each shard's table of interned names.
const maxNames = 4096

// flushChunk is how many dirty entries a flush copies per shard-lock hold.
const flushChunk = 512

// maxSpare is the largest dirty list a shard keeps for reuse.
const maxSpare = 8192

// shard is one independently locked part of the cache.
type shard struct {
	mu  sync.Mutex
	lru *simplelru.LRU[Key, *entry]
	// pending holds entries the LRU evicted before their changes were
	// written; a miss looks here before the store. A flush that writes an
	// entry's last change removes it.
	pending map[Key]*entry
	dirty   []dirtyRef // entries to write at the next flush
	spare   []dirtyRef // the previous dirty list, reused
	names   map[string]string
	// moved holds the keys Release handed to another node, with the Unix
	// nanosecond time until which Decide refuses them.
	moved map[Key]int64
	now   int64 // the now of the call that may evict, for onEvict
	// writeSeq is bumped whenever a flush completes in this shard: a load
	// that raced with one may have read an older record and must retry.
	writeSeq uint64
	closed   bool

	hits, misses, loads, evictions uint64
}

// onEvict keeps an evicted entry whose changes are unwritten and not yet
// expired in pending.
func (s *shard) onEvict(k Key, e *entry) {
	s.evictions++
	if e.dirty() && !e.state.Fresh(s.now) {
		s.pending[k] = e
		return
	}
	e.setQueued(false) // its dirty reference, if any, is now a no-op
}

// lookup finds k in memory, moving it from pending back into the LRU.
func (s *shard) lookup(k Key, now int64) *entry {
	if e, ok := s.lru.Get(k); ok {
		return e
	}
	e, ok := s.pending[k]
	if !ok {
		return nil
	}
	delete(s.pending, k)
	s.insert(k, e, now)
	return e
}

// insert adds e under an owned copy of k.
func (s *shard) insert(k Key, e *entry, now int64) {
	name, ok := s.names[k.Name]
	if !ok {
		name = strings.Clone(k.Name)
		if len(s.names) < maxNames {
			s.names[name] = name
		}
	}
	s.now = now
	s.lru.Add(Key{Name: name, Key: strings.Clone(k.Key)}, e)
}

// changed records a change of e's state.
func (s *shard) changed(k Key, e *entry, now int64) {
	// Versions follow the clock so that they keep growing even after a key
	// expired, was deleted and started again.
	e.version = max(e.version+1, uint64(max(now, 0)))
	s.queue(k, e)
}

// queue puts e on the dirty list unless it is there.
func (s *shard) queue(k Key, e *entry) {
	if !e.queued() {
		e.setQueued(true)
		s.dirty = append(s.dirty, dirtyRef{key: k, e: e})
	}
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
	storeClosed bool          // guarded by flushSem

	life   sync.Mutex // guards cancel and started
	cancel context.CancelFunc
	loops  sync.WaitGroup

	flushes, flushedRecords, flushErrors atomic.Uint64
	expiredDeleted, expiryErrors         atomic.Uint64
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
	}
	per := cfg.Size / cfg.Shards
	for i := range c.shards {
		s := &shard{pending: map[Key]*entry{}, names: map[string]string{}, moved: map[Key]int64{}}
		lru, err := simplelru.NewLRU(per, s.onEvict)
		if err != nil {
			return nil, err
		}
		s.lru = lru
		c.shards[i] = s
	}
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
func (c *Cache) find(s *shard, k Key, now int64, create bool) (*entry, error) {
	s.mu.Lock()
	if s.closed {
		return nil, ErrClosed
	}
	if e := s.lookup(k, now); e != nil {
		s.hits++
		return e, nil
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
		if e := s.lookup(k, now); e != nil {
			return e, nil // loaded by another call meanwhile
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
		e := &entry{state: rec.State, version: rec.Version, meta: rec.Version &^ queuedBit}
		s.insert(k, e, now)
		return e, nil
	}
}

// Decide applies hits against lim to the counter of k at now (Unix
// nanoseconds) and returns the decision. hash is the caller's 64-bit hash of
// k; it picks the shard. A key not in memory is loaded from the store
// (without holding the shard lock) or starts fresh. The error is ErrClosed
// or a store read failure. A hit allocates nothing.
func (c *Cache) Decide(hash uint64, k Key, lim bucket.Limit, hits, now int64) (bucket.Decision, error) {
	return c.DecideLoad(hash, k, lim, hits, now, 1)
}

// DecideLoad is Decide with the node's load in [0, 1] for elastic limits
// (bucket.DecideLoad).
func (c *Cache) DecideLoad(hash uint64, k Key, lim bucket.Limit, hits, now int64, load float64) (bucket.Decision, error) {
	s := c.shardFor(hash)
	e, err := c.find(s, k, now, true)
	if err == nil && len(s.moved) > 0 && s.isMoved(k, now) {
		err = ErrMoved
	}
	if err != nil {
		s.mu.Unlock()
		return bucket.Decision{}, err
	}
	before := e.state
	d := bucket.DecideLoad(&e.state, lim, hits, now, load)
	if e.state != before {
		s.changed(k, e, now)
		if c.cfg.OnChange != nil {
			c.cfg.OnChange(hash, k)
		}
	}
	s.mu.Unlock()
	return d, nil
}

// SubKey is the key under which the cache keeps the state of limit i of a
// multi-limit check on k: the name gains a NUL (names never contain one)
// and the limit's index, so it cannot collide with a single-limit key.
func SubKey(k Key, i int) Key {
	return Key{Name: k.Name + "\x00" + strconv.Itoa(i), Key: k.Key}
}

// BaseKey returns the key a SubKey was made from (k itself otherwise).
func BaseKey(k Key) Key {
	if i := strings.IndexByte(k.Name, 0); i >= 0 {
		k.Name = k.Name[:i]
	}
	return k
}

// DecideAll applies hits to the limits lims of k atomically: every limit
// admits and all consume, or none does (bucket.DecideAllLoad). Limit i's
// state is kept under SubKey(k, i), in the same shard, so one lock covers
// them all. It returns the combined decision (bucket.Combine). ErrMoved when
// any of the keys is released.
func (c *Cache) DecideAll(hash uint64, k Key, lims []bucket.Limit, hits, now int64, load float64) (bucket.Decision, error) {
	s := c.shardFor(hash)
	keys := make([]Key, len(lims))
	for i := range lims {
		keys[i] = SubKey(k, i)
	}
	es := make([]*entry, len(lims))
	for attempt := 0; ; attempt++ {
		// Load every state (each find may drop the lock for a store read),
		// then check under one hold of the lock that all are still there.
		for i := range keys {
			e, err := c.find(s, keys[i], now, true)
			s.mu.Unlock()
			if err != nil {
				return bucket.Decision{}, err
			}
			es[i] = e
		}
		s.mu.Lock()
		same := true
		for i := range keys {
			same = same && s.lookup(keys[i], now) == es[i]
		}
		if same {
			break
		}
		s.mu.Unlock()
		if attempt == 10 {
			return bucket.Decision{}, fmt.Errorf("writeback: %d limits of one key do not fit in the cache at once", len(lims))
		}
	}
	defer s.mu.Unlock()
	if len(s.moved) > 0 {
		for i := range keys {
			if s.isMoved(keys[i], now) {
				return bucket.Decision{}, ErrMoved
			}
		}
	}
	states := make([]*bucket.State, len(es))
	before := make([]bucket.State, len(es))
	for i, e := range es {
		states[i], before[i] = &e.state, e.state
	}
	out := make([]bucket.Decision, len(lims))
	bucket.DecideAllLoad(states, lims, hits, now, load, out)
	for i, e := range es {
		if e.state != before[i] {
			s.changed(keys[i], e, now)
			if c.cfg.OnChange != nil {
				c.cfg.OnChange(hash, keys[i])
			}
		}
	}
	return bucket.Combine(out), nil
}

// isMoved reports whether k is released at now, forgetting an expired
// release. s.mu must be held.
func (s *shard) isMoved(k Key, now int64) bool {
	until, ok := s.moved[k]
	if ok && until <= now {
		delete(s.moved, k)
		ok = false
	}
	return ok
}

// Release returns k's current record, like Get, and atomically stops this
// cache from deciding k until now+ttl (Decide answers ErrMoved): the key now
// belongs to another node, which got the returned record. Every change
// Decide made before Release is in the record.
func (c *Cache) Release(hash uint64, k Key, now int64, ttl time.Duration) (Record, bool, error) {
	s := c.shardFor(hash)
	e, err := c.find(s, k, now, false)
	defer s.mu.Unlock()
	if err != nil {
		return Record{}, false, err
	}
	s.moved[Key{Name: strings.Clone(k.Name), Key: strings.Clone(k.Key)}] = now + int64(ttl)
	if e == nil || e.state.Fresh(now) {
		return Record{}, false, nil
	}
	return Record{Key: k, State: e.state, Version: e.version}, true, nil
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
// whether it did. An installed record counts as a change (OnChange).
func (c *Cache) Adopt(hash uint64, rec Record) bool {
	return c.install(hash, rec, true)
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
		add := func(k Key, e *entry) {
			if !e.state.Fresh(now) {
				recs = append(recs, Record{Key: k, State: e.state, Version: e.version})
			}
		}
		for _, k := range s.lru.Keys() {
			if e, ok := s.lru.Peek(k); ok {
				add(k, e)
			}
		}
		for k, e := range s.pending {
			add(k, e)
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
	e, err := c.find(s, k, now, false)
	defer s.mu.Unlock()
	if err != nil || e == nil || e.state.Fresh(now) {
		return Record{}, false, err
	}
	return Record{Key: k, State: e.state, Version: e.version}, true, nil
}

// Merge installs rec when its Version is newer than the one held in memory
// or in the store, and marks it dirty. It reports whether it installed rec;
// a store read failure is logged and reported as false.
func (c *Cache) Merge(hash uint64, rec Record) bool {
	return c.install(hash, rec, false)
}

// install is Merge, and with adopt Adopt.
func (c *Cache) install(hash uint64, rec Record, adopt bool) bool {
	s := c.shardFor(hash)
	// now 0: a stored record counts as absent only when it is the zero state,
	// and an evicted entry is kept for its write unless it is.
	e, err := c.find(s, rec.Key, 0, true)
	defer s.mu.Unlock()
	if err != nil {
		if !errors.Is(err, ErrClosed) {
			c.log.Error("writeback: store read failed; counter not installed", "name", rec.Key.Name, "key", rec.Key.Key, "err", err)
		}
		return false
	}
	if adopt {
		delete(s.moved, rec.Key)
	}
	if rec.Version <= e.version {
		return false
	}
	e.state, e.version = rec.State, rec.Version
	s.queue(rec.Key, e)
	if adopt && c.cfg.OnChange != nil {
		c.cfg.OnChange(hash, rec.Key)
	}
	return true
}

// Dirty returns the number of entries whose changes are not yet in the
// store (dirty entries in memory and evicted ones waiting for their write).
func (c *Cache) Dirty() int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		for _, r := range s.dirty {
			if r.e.queued() && r.e.dirty() {
				n++
			}
		}
		for _, e := range s.pending {
			if !e.queued() && e.dirty() {
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

// flushItem is one record of a flush and where it came from.
type flushItem struct {
	s *shard
	e *entry
}

// Flush writes every dirty and pending entry to the store now, as one
// batch. Shard locks are held only to copy states, never during the write,
// so checks do not wait on disk. An entry changed during the write stays
// dirty. On failure every entry stays dirty for the next flush, and the
// failure is logged and counted. Flushes run one at a time.
func (c *Cache) Flush(ctx context.Context) error {
	select {
	case c.flushSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.flushSem }()
	if c.storeClosed {
		return ErrClosed
	}
	return c.flush(ctx)
}

// flush does Flush with flushSem held.
func (c *Cache) flush(ctx context.Context) error {
	var recs []Record
	var items []flushItem
	for _, s := range c.shards {
		s.mu.Lock()
		all := s.dirty
		s.dirty, s.spare = s.spare[:0], nil
		s.mu.Unlock()
		for refs := all; len(refs) > 0; {
			chunk := refs[:min(len(refs), flushChunk)]
			refs = refs[len(chunk):]
			s.mu.Lock()
			for _, r := range chunk {
				if !r.e.queued() {
					continue
				}
				r.e.setQueued(false)
				recs = append(recs, Record{Key: r.key, State: r.e.state, Version: r.e.version})
				items = append(items, flushItem{s: s, e: r.e})
			}
			s.mu.Unlock()
		}
		clear(all) // drop the keys and entries for the GC
		s.mu.Lock()
		if s.spare == nil && cap(all) <= maxSpare {
			s.spare = all[:0]
		}
		s.mu.Unlock()
	}
	if len(recs) == 0 {
		return nil
	}
	err := ctx.Err()
	if err == nil {
		if err = c.store.Write(recs); err != nil {
			c.flushErrors.Add(1)
			c.log.Error("writeback: flush failed; entries stay dirty", "records", len(recs), "err", err)
		}
	}
	if err != nil {
		c.requeue(recs, items)
		return err
	}
	c.flushes.Add(1)
	c.flushedRecords.Add(uint64(len(recs)))
	var s *shard
	for i, it := range items {
		if it.s != s {
			if s != nil {
				s.writeSeq++
				s.mu.Unlock()
			}
			s = it.s
			s.mu.Lock()
		}
		e := it.e
		e.setFlushed(max(e.flushed(), recs[i].Version))
		if !e.dirty() {
			if p, ok := s.pending[recs[i].Key]; ok && p == e {
				delete(s.pending, recs[i].Key)
			}
		}
	}
	s.writeSeq++
	s.mu.Unlock()
	return nil
}

// requeue puts the entries of a failed flush back on their dirty lists.
func (c *Cache) requeue(recs []Record, items []flushItem) {
	var s *shard
	for i, it := range items {
		if it.s != s {
			if s != nil {
				s.mu.Unlock()
			}
			s = it.s
			s.mu.Lock()
		}
		if e := it.e; e.dirty() && !e.queued() {
			e.setQueued(true)
			s.dirty = append(s.dirty, dirtyRef{key: recs[i].Key, e: e})
		}
	}
	if s != nil {
		s.mu.Unlock()
	}
}

// Start starts the flush and expiry loops. They stop when ctx ends or at
// Close. Calling Start again does nothing.
func (c *Cache) Start(ctx context.Context) {
	c.life.Lock()
	defer c.life.Unlock()
	if c.cancel != nil || c.closed.Load() {
		return
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.loops.Add(2)
	go c.flushLoop(ctx)
	go c.expiryLoop(ctx)
}

func (c *Cache) flushLoop(ctx context.Context) {
	c.tick(ctx, c.cfg.FlushInterval, func() {
		_ = c.Flush(ctx) // logged and counted by Flush
	})
}

func (c *Cache) expiryLoop(ctx context.Context) {
	c.tick(ctx, c.cfg.ExpiryInterval, func() { c.expire(time.Now().UnixNano()) })
}

// tick calls fn every d until ctx ends; it runs on a loop goroutine.
func (c *Cache) tick(ctx context.Context, d time.Duration, fn func()) {
	defer c.loops.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// expire runs one bounded expiry pass over the store.
func (c *Cache) expire(now int64) {
	n, err := c.store.DeleteExpired(now, c.cfg.ExpiryBatch)
	c.expiredDeleted.Add(uint64(n))
	if err != nil {
		c.expiryErrors.Add(1)
		c.log.Error("writeback: expiry pass failed", "err", err)
	}
}

// Close stops the loops and waits for them, refuses further calls, flushes
// every dirty and pending entry and closes the store. When the final flush
// fails (or ctx ends first) the store is still closed and the error says
// that changes were lost.
func (c *Cache) Close(ctx context.Context) error {
	if !c.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	c.life.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.life.Unlock()
	c.loops.Wait()
	for _, s := range c.shards {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
	}
	c.loadWG.Wait()
	select {
	case c.flushSem <- struct{}{}:
	case <-ctx.Done():
		// A flush is stuck; the store cannot be closed under it.
		return fmt.Errorf("writeback: close: %w", ctx.Err())
	}
	defer func() { <-c.flushSem }()
	ferr := c.flush(ctx)
	if ferr != nil {
		ferr = fmt.Errorf("writeback: close: final flush failed, unwritten changes lost: %w", ferr)
	}
	c.storeClosed = true
	return errors.Join(ferr, c.store.Close())
}
