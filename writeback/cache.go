package writeback

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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

// slot is the live state of one key: a bucket.State (its Algorithm kept in
// meta), the version and the key's bytes. It is 64 bytes because the cache
// holds a million of them: the key is a pointer to its bytes with the
// length in meta, and the name is an index into the shard's table of names
// (or, past that table's bound, stored in front of the key's bytes). Slots
// live in the shard's slab and are named by 32-bit indices, which keeps the
// LRU's list element at 64 bytes too. A slot is reached from exactly one of
// its shard's LRU, overflow LRU or pending map; the dirty and changed lists
// point to it. Every field is guarded by the shard's mutex.
type slot struct {
	start, count, prev, expires int64
	ext                         *bucket.Ext
	version                     uint64 // bumped by every change
	meta                        uint64 // see the meta layout below
	kp                          *byte  // the key's bytes (after the name's, when not interned)
}

// The meta word of a slot.
const (
	keyLenMask   = 1<<16 - 1 // bits 0–15: length of the bytes at kp
	nameIdxShift = 16        // bits 16–31: the name's index in shard.names; 0: not interned
	nameLenShift = 32        // bits 32–47: the name's length when not interned
	algShift     = 48        // bits 48–55: the State's Algorithm
	changedBit   = 1 << 61   // on shard.changed, not yet taken by TakeChanged
	queuedBit    = 1 << 62   // on shard.dirty, not yet copied by a flush
	dirtyBit     = 1 << 63   // has a change the store may not hold yet
	maxKeyBytes  = keyLenMask
)

func (sl *slot) has(bit uint64) bool { return sl.meta&bit != 0 }
func (sl *slot) set(bit uint64)      { sl.meta |= bit }
func (sl *slot) clear(bit uint64)    { sl.meta &^= bit }

// bytes returns the bytes the slot keeps at kp.
func (sl *slot) bytes() string { return unsafe.String(sl.kp, int(sl.meta&keyLenMask)) }

func (sl *slot) nameIdx() int { return int(sl.meta >> nameIdxShift & 0xffff) }

func (sl *slot) state() bucket.State {
	var st bucket.State
	sl.loadState(&st)
	return st
}

// loadState writes sl's state to *st field by field (a State returned by
// value is copied whole, which stalls store forwarding on the hot path).
func (sl *slot) loadState(st *bucket.State) {
	st.Algorithm = bucket.Algorithm(sl.meta >> algShift)
	st.Start, st.Count, st.Prev, st.Expires, st.Ext = sl.start, sl.count, sl.prev, sl.expires, sl.ext
}

func (sl *slot) setState(st bucket.State) {
	sl.start, sl.count, sl.prev, sl.expires, sl.ext = st.Start, st.Count, st.Prev, st.Expires, st.Ext
	sl.meta = sl.meta&^(0xff<<algShift) | uint64(st.Algorithm)<<algShift
}

// differs reports whether st is not the state sl holds. (Field by field:
// see bucket.DecideWith on whole-struct copies.)
func (sl *slot) differs(st *bucket.State) bool {
	return st.Start != sl.start || st.Count != sl.count || st.Prev != sl.prev || st.Expires != sl.expires ||
		st.Ext != sl.ext || uint64(st.Algorithm) != sl.meta>>algShift&0xff
}

func (sl *slot) fresh(now int64) bool { return bucket.FreshAt(sl.expires, now) }

// ref is a slot on a shard's changed list, with the caller's hash of its key.
type ref struct {
	h  uint64
	sl *slot
}

// slab holds a shard's slots in fixed chunks, so that a slot never moves,
// addressed by 32-bit indices; index 0 is never used.
type slab struct {
	chunks [][]slot
	free   []uint32
	next   uint32 // the next index to hand out (after checking it)
}

const (
	chunkBits = 8
	chunkMask = 1<<chunkBits - 1
	// chunkSlots is one less than a power of two: a chunk of 255 slots
	// and the 8-byte header Go gives large objects with pointers fill a
	// 16 KiB size class (256 slots would take an 18 KiB one).
	chunkSlots = chunkMask
)

func (b *slab) at(i uint32) *slot { return &b.chunks[i>>chunkBits][i&chunkMask] }

// alloc returns a zero slot and its index.
func (b *slab) alloc() (uint32, *slot) {
	if n := len(b.free); n > 0 {
		i := b.free[n-1]
		b.free = b.free[:n-1]
		return i, b.at(i)
	}
	if b.next == 0 || b.next&chunkMask == chunkSlots {
		b.next++ // index 0 is never used, nor the offset a chunk lacks
	}
	i := b.next
	if int(i>>chunkBits) == len(b.chunks) {
		b.chunks = append(b.chunks, make([]slot, chunkSlots))
	}
	b.next++
	return i, b.at(i)
}

// release zeroes slot i (dropping what it points to) for reuse.
func (b *slab) release(i uint32) {
	*b.at(i) = slot{}
	b.free = append(b.free, i)
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
	// takes counts TakeChanged calls: see retired.
	flushStarts, flushDone, takes uint64

	// moved holds the keys Release handed to another node, with the Unix
	// nanosecond time until which Decide refuses them.
	moved map[Key]release
	now   int64 // the now of the call that may evict, for onEvict
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

// retire puts the dropped slot i in limbo (see retired).
func (s *shard) retire(i uint32) {
	s.limbo = append(s.limbo, retired{i: i, flush: s.flushStarts, take: s.takes})
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
		s.dirty = append(s.dirty, sl)
	}
}

// markChanged puts sl on the list of changes unless it is there (with
// TrackChanges).
func (s *shard) markChanged(h uint64, sl *slot) {
	if s.track && !sl.has(changedBit) {
		sl.set(changedBit)
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
		flushNow: make(chan struct{}, 1),
	}
	per := cfg.Size / cfg.Shards
	for i := range c.shards {
		s := &shard{pending: map[Key]uint32{}, nameIdx: map[string]uint16{}, moved: map[Key]release{}, track: cfg.TrackChanges,
			pendingMax: max(per/pendingShare, minPendingMax), kick: c.flushNow}
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

// release is when a key was released (Unix ns) and until when.
type release struct{ at, until int64 }

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
// belongs to another node, which got the returned record. Every change
// Decide made before Release is in the record.
func (c *Cache) Release(hash uint64, k Key, now int64, ttl time.Duration) (Record, bool, error) {
	s := c.shardFor(hash)
	sl, err := c.find(s, hash, k, now, false)
	defer s.mu.Unlock()
	if err != nil {
		return Record{}, false, err
	}
	s.moved[Key{Name: strings.Clone(k.Name), Key: strings.Clone(k.Key)}] = release{at: now, until: now + int64(ttl)}
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
	return c.install(hash, rec, true, math.MaxInt64)
}

// AdoptUnlessReleasedSince is Adopt, except that when this cache released
// the key at or after since (Unix ns) it changes nothing and reports false.
// A node that pulls a key from another (since: when it began) must not end
// a release that happened meanwhile: the node the key went to took this
// cache's state, and it decides the key now.
func (c *Cache) AdoptUnlessReleasedSince(hash uint64, rec Record, since int64) bool {
	return c.install(hash, rec, true, since)
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
// or in the store, and marks it dirty. It reports whether it installed rec;
// a store read failure is logged and reported as false.
func (c *Cache) Merge(hash uint64, rec Record) bool {
	return c.install(hash, rec, false, math.MaxInt64)
}

// install is Merge, and with adopt AdoptUnlessReleasedSince.
func (c *Cache) install(hash uint64, rec Record, adopt bool, since int64) bool {
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
	if adopt {
		if r, ok := s.moved[rec.Key]; ok && r.at >= since {
			return false
		}
		delete(s.moved, rec.Key)
	}
	if rec.Version <= e.version {
		return false
	}
	e.setState(rec.State)
	e.version = rec.Version
	s.queue(e)
	if adopt {
		s.markChanged(hash, e)
	}
	return true
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

// flushItem is one record of a flush and where it came from.
type flushItem struct {
	s  *shard
	sl *slot
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
	gens := make([]uint64, len(c.shards))
	for si, s := range c.shards {
		s.mu.Lock()
		s.flushStarts++
		gens[si] = s.flushStarts
		all := s.dirty
		s.dirty, s.spare = s.spare[:0], nil
		s.mu.Unlock()
		for refs := all; len(refs) > 0; {
			chunk := refs[:min(len(refs), flushChunk)]
			refs = refs[len(chunk):]
			s.mu.Lock()
			for _, sl := range chunk {
				if !sl.has(queuedBit) {
					continue
				}
				sl.clear(queuedBit)
				recs = append(recs, Record{Key: s.keyOf(sl), State: sl.state(), Version: sl.version})
				items = append(items, flushItem{s: s, sl: sl})
			}
			s.mu.Unlock()
		}
		clear(all) // drop the references for the GC
		s.mu.Lock()
		if s.spare == nil && cap(all) <= maxSpare {
			s.spare = all[:0]
		}
		s.mu.Unlock()
	}
	var err error
	if len(recs) > 0 {
		if err = ctx.Err(); err == nil {
			if err = c.store.Write(recs); err != nil {
				c.flushErrors.Add(1)
				c.log.Error("writeback: flush failed; entries stay dirty", "records", len(recs), "err", err)
			}
		}
	}
	if err != nil {
		c.requeue(items)
	} else if len(recs) > 0 {
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
			// Versions only grow: the same version means no change since
			// the copy was taken.
			if sl := it.sl; sl.version == recs[i].Version && !sl.has(queuedBit) {
				sl.clear(dirtyBit)
				if p, ok := s.pending[recs[i].Key]; ok && s.slots.at(p) == sl {
					delete(s.pending, recs[i].Key)
					s.retire(p)
				}
			}
		}
		s.writeSeq++
		s.mu.Unlock()
	}
	// This flush holds no slot any more: release what waited for it.
	for si, s := range c.shards {
		s.mu.Lock()
		s.flushDone = gens[si]
		s.reap()
		s.mu.Unlock()
	}
	return err
}

// requeue puts the entries of a failed flush back on their dirty lists.
func (c *Cache) requeue(items []flushItem) {
	var s *shard
	for _, it := range items {
		if it.s != s {
			if s != nil {
				s.mu.Unlock()
			}
			s = it.s
			s.mu.Lock()
		}
		if sl := it.sl; sl.has(dirtyBit) && !sl.has(queuedBit) {
			sl.set(queuedBit)
			s.dirty = append(s.dirty, sl)
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

// flushLoop flushes every FlushInterval, and at once when a shard's
// evicted entries waiting for their write reach its pendingMax.
func (c *Cache) flushLoop(ctx context.Context) {
	c.tick(ctx, c.cfg.FlushInterval, c.flushNow, func() {
		_ = c.Flush(ctx) // logged and counted by Flush
	})
}

func (c *Cache) expiryLoop(ctx context.Context) {
	c.tick(ctx, c.cfg.ExpiryInterval, nil, func() { c.expire(time.Now().UnixNano()) })
}

// tick calls fn every d, and whenever kick (nil: never) delivers, until ctx
// ends; it runs on a loop goroutine.
func (c *Cache) tick(ctx context.Context, d time.Duration, kick <-chan struct{}, fn func()) {
	defer c.loops.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
		fn()
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
