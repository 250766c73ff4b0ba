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
	"unsafe"

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

// retired is an evicted slot waiting until nothing can refer to it any
// more: the dirty list of the flush in progress and the list of changes
// may still hold it (and must not see another key in it). It is released
// once a flush that started after its retirement has completed and, with
// TrackChanges, a TakeChanged has run since.
type retired struct {
	i           uint32
	flush, take uint64 // the shard's flushStarts and takes at retirement
}

// maxNames bounds each shard's table of interned names.
const maxNames = 4096

// overSize is the capacity of a shard's overflow LRU, which holds keys
// whose 64-bit hash collides with a key already in the shard's LRU.
const overSize = 1024

// A shard asks for a flush before the next interval once its evicted
// entries waiting for their write reach 1/pendingShare of its size (at
// least minPendingMax): memory stays within about Size×(1+1/pendingShare)
// entries plus what is evicted while that flush runs.
const (
	pendingShare  = 8
	minPendingMax = 16
)

// flushChunk is how many dirty entries a flush copies per shard-lock hold.
const flushChunk = 512

// maxSpare is the largest dirty list a shard keeps for reuse.
const maxSpare = 1024

// shard is one independently locked part of the cache.
type shard struct {
	mu sync.Mutex
	// lru holds the live slots by the low 32 bits of their key's hash
	// (cacheHash; the shard came from the top bits); a key whose hash is
	// taken by another key lives in over instead.
	lru  *simplelru.LRU[uint32, uint32]
	over *simplelru.LRU[Key, uint32] // made on the first collision
	// pending holds slots the LRU evicted before their changes were
	// written; a miss looks here before the store. A flush that writes a
	// slot's last change removes it.
	pending map[Key]uint32
	// pendingMax is how many entries may wait in pending before the shard
	// asks for a flush at once (kick, shared by the shards): without it,
	// heavy churn would hold evicted entries until the next interval.
	pendingMax int
	kick       chan<- struct{}
	dirtied    chan<- struct{} // Cache.dirtied: the dirty list became non-empty
	notify     chan<- struct{} // Cache.changes: the changed list became non-empty
	slots      slab
	limbo      []retired
	dirty      []*slot // slots to write at the next flush
	spare      []*slot // the previous dirty list, reused
	track      bool    // keep the changed list (Config.TrackChanges)
	changes    []ref   // slots changed since the last TakeChanged
	names      []string
	nameIdx    map[string]uint16

	// flushStarts counts the flushes that took this shard's dirty list,
	// flushDone is the count at the start of the last one that completed,
	// takes counts TakeChanged calls, from 1: see retired.
	flushStarts, flushDone, takes uint64

	// moved holds the keys Release handed to another node, with the Unix
	// nanosecond time until which Decide refuses them.
	moved map[Key]release
	// movedSweepAt is the size of moved at which Release next drops the
	// expired releases (isMoved drops one only when its key is looked up
	// again, and most never are): twice the size after the last sweep, at
	// least minMovedSweep, so the map stays within twice the releases in
	// force and a sweep costs O(1) per Release, amortised.
	movedSweepAt int
	now          int64 // the now of the call that may evict, for onEvict
	// writeSeq is bumped whenever a flush completes in this shard: a load
	// that raced with one may have read an older record and must retry.
	writeSeq uint64
	closed   bool

	hits, misses, loads, evictions uint64
}

// keyOf returns sl's key. The strings share the slot's bytes and the
// shard's names: they are immutable and never copied.
func (s *shard) keyOf(sl *slot) Key {
	b := sl.bytes()
	if i := sl.nameIdx(); i != 0 {
		return Key{Name: s.names[i], Key: b}
	}
	n := int(sl.meta >> nameLenShift & 0xffff)
	return Key{Name: b[:n], Key: b[n:]}
}

// is reports whether sl holds k.
func (s *shard) is(sl *slot, k Key) bool {
	b := sl.bytes()
	if i := sl.nameIdx(); i != 0 {
		return b == k.Key && s.names[i] == k.Name
	}
	n := int(sl.meta >> nameLenShift & 0xffff)
	return len(b) == len(k.Name)+len(k.Key) && b[n:] == k.Key && b[:n] == k.Name
}

// newSlot returns a slot for an owned copy of k holding rec's state.
func (s *shard) newSlot(k Key, st bucket.State, version uint64) (uint32, *slot, error) {
	if len(k.Name)+len(k.Key) > maxKeyBytes {
		return 0, nil, fmt.Errorf("writeback: key of %d bytes is too long to cache", len(k.Name)+len(k.Key))
	}
	i, ok := s.nameIdx[k.Name]
	if !ok && len(s.names) < maxNames {
		if len(s.names) == 0 {
			s.names = append(s.names, "") // index 0 means "not interned"
		}
		i = uint16(len(s.names))
		name := strings.Clone(k.Name)
		s.names = append(s.names, name)
		s.nameIdx[name] = i
	}
	var b string
	meta := uint64(i) << nameIdxShift
	if i != 0 {
		b = strings.Clone(k.Key)
	} else {
		b = k.Name + k.Key
		meta |= uint64(len(k.Name)) << nameLenShift
	}
	idx, sl := s.slots.alloc()
	*sl = slot{version: version, meta: meta | uint64(len(b)), kp: unsafe.StringData(b)}
	sl.setState(st)
	return idx, sl, nil
}

// cacheHash is the key under which the LRU holds k: the caller's hash of
// the key, which is the same for every limit of a multi-limit key (SubKey),
// mixed with the limit's suffix of the name.
func cacheHash(h uint64, name string) uint32 {
	i := strings.IndexByte(name, 0)
	if i < 0 {
		return uint32(h)
	}
	for _, c := range []byte(name[i:]) {
		h = (h ^ uint64(c)) * 0x100000001b3
	}
	return uint32(h ^ h>>32)
}

// onEvict keeps an evicted slot whose changes are unwritten and not yet
// expired in pending.
func (s *shard) onEvict(i uint32) {
	s.evictions++
	sl := s.slots.at(i)
	if sl.has(dirtyBit) && !sl.fresh(s.now) {
		s.pending[s.keyOf(sl)] = i
		if len(s.pending) >= s.pendingMax {
			select {
			case s.kick <- struct{}{}:
			default: // a flush is already asked for
			}
		}
		return
	}
	sl.clear(queuedBit | dirtyBit) // its dirty reference, if any, is now a no-op
	s.retire(i)
}

// retire puts the dropped slot i in limbo (see retired). When the list of
// changes is empty it cannot hold the slot, so the slot need not wait for a
// TakeChanged (which runs only once something changes).
func (s *shard) retire(i uint32) {
	take := s.takes
	if len(s.changes) == 0 {
		take-- // takes starts at 1
	}
	s.limbo = append(s.limbo, retired{i: i, flush: s.flushStarts, take: take})
}

// reap releases the slots in limbo that nothing can refer to any more.
func (s *shard) reap() {
	keep := s.limbo[:0]
	for _, r := range s.limbo {
		if s.flushDone > r.flush && (!s.track || s.takes > r.take) {
			s.slots.release(r.i)
		} else {
			keep = append(keep, r)
		}
	}
	clear(s.limbo[len(keep):])
	s.limbo = keep
}

// lookup finds k in memory, moving it from pending back into an LRU.
func (s *shard) lookup(ch uint32, k Key, now int64) *slot {
	if i, ok := s.lru.Get(ch); ok {
		if sl := s.slots.at(i); s.is(sl, k) {
			return sl
		}
	}
	if s.over != nil && s.over.Len() > 0 {
		if i, ok := s.over.Get(k); ok {
			return s.slots.at(i)
		}
	}
	i, ok := s.pending[k]
	if !ok {
		return nil
	}
	delete(s.pending, k)
	s.insert(ch, i, now)
	return s.slots.at(i)
}

// insert adds slot i to the LRU, or to the overflow LRU when another key
// holds ch.
func (s *shard) insert(ch uint32, i uint32, now int64) {
	s.now = now
	if !s.lru.Contains(ch) {
		s.lru.Add(ch, i)
		return
	}
	if s.over == nil {
		s.over, _ = simplelru.NewLRU(overSize, func(_ Key, i uint32) { s.onEvict(i) })
	}
	s.over.Add(s.keyOf(s.slots.at(i)), i)
}

// changed records a change of sl's state; h is the caller's hash of its key.
func (s *shard) changed(h uint64, sl *slot, now int64) {
	// Versions follow the clock so that they keep growing even after a key
	// expired, was deleted and started again.
	sl.version = max(sl.version+1, uint64(max(now, 0)))
	s.queue(sl)
	s.markChanged(h, sl)
}

// queue puts sl on the dirty list unless it is there.
func (s *shard) queue(sl *slot) {
	sl.set(dirtyBit)
	if !sl.has(queuedBit) {
		sl.set(queuedBit)
		s.push(sl)
	}
}

// push appends sl to the dirty list. The first entry since a flush took
// the list tells the flush loop, which sleeps while nothing is dirty.
func (s *shard) push(sl *slot) {
	if len(s.dirty) == 0 {
		select {
		case s.dirtied <- struct{}{}:
		default: // already told
		}
	}
	s.dirty = append(s.dirty, sl)
}

// markChanged puts sl on the list of changes unless it is there (with
// TrackChanges).
func (s *shard) markChanged(h uint64, sl *slot) {
	if s.track && !sl.has(changedBit) {
		sl.set(changedBit)
		if len(s.changes) == 0 {
			// The first change since the last TakeChanged: tell the
			// replication loop there is work (it sleeps otherwise).
			select {
			case s.notify <- struct{}{}:
			default: // already told
			}
		}
		s.changes = append(s.changes, ref{h: h, sl: sl})
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
	flushNow    chan struct{} // capacity 1: a shard's pending entries need a flush
	dirtied     chan struct{} // capacity 1: a shard's dirty list became non-empty
	changes     chan struct{} // capacity 1: see Changes
	storeClosed bool          // guarded by flushSem

	life   sync.Mutex // guards cancel and started
	cancel context.CancelFunc
	loops  sync.WaitGroup

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
		s := &shard{pending: map[Key]uint32{}, nameIdx: map[string]uint16{}, moved: map[Key]release{}, track: cfg.TrackChanges,
			pendingMax: max(per/pendingShare, minPendingMax), kick: c.flushNow, dirtied: c.dirtied, notify: c.changes, takes: 1}
		lru, err := simplelru.NewLRU(per, func(_ uint32, i uint32) { s.onEvict(i) })
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
func (c *Cache) find(s *shard, h uint64, k Key, now int64, create bool) (*slot, error) {
	ch := cacheHash(h, k.Name)
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
		i, sl, err := s.newSlot(k, rec.State, rec.Version)
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
// for why), for the path of every check. On error *out is not written.
func (c *Cache) DecideTo(out *bucket.Decision, hash uint64, k Key, lim *bucket.Limit, hits, now int64, load float64) error {
	s := c.shardFor(hash)
	sl, err := c.find(s, hash, k, now, true)
	if err == nil && len(s.moved) > 0 && s.isMoved(k, now) {
		err = ErrMoved
	}
	if err != nil {
		s.mu.Unlock()
		return err
	}
	var st bucket.State
	sl.loadState(&st)
	bucket.DecideTo(out, &st, lim, hits, now, load)
	if sl.differs(&st) {
		sl.setState(st)
		s.changed(hash, sl, now)
	}
	s.mu.Unlock()
	return nil
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
	es := make([]*slot, len(lims))
	for attempt := 0; ; attempt++ {
		// Load every state (each find may drop the lock for a store read),
		// then check under one hold of the lock that all are still there.
		for i := range keys {
			e, err := c.find(s, hash, keys[i], now, true)
			s.mu.Unlock()
			if err != nil {
				return bucket.Decision{}, err
			}
			es[i] = e
		}
		s.mu.Lock()
		same := true
		for i := range keys {
			same = same && s.lookup(cacheHash(hash, keys[i].Name), keys[i], now) == es[i]
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
	vals := make([]bucket.State, len(es))
	states := make([]*bucket.State, len(es))
	before := make([]bucket.State, len(es))
	for i, e := range es {
		vals[i] = e.state()
		states[i], before[i] = &vals[i], vals[i]
	}
	out := make([]bucket.Decision, len(lims))
	bucket.DecideAllLoad(states, lims, hits, now, load, out)
	for i, e := range es {
		if vals[i] != before[i] {
			e.setState(vals[i])
			s.changed(hash, e, now)
		}
	}
	return bucket.Combine(out), nil
}

// TakeChanged calls fn, without any lock held, with the caller's hash and
// the current record of every key changed by Decide or installed by Adopt
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
	if sl := s.lookup(cacheHash(hash, k.Name), k, s.now); sl != nil {
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
