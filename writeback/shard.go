package writeback

// A cache shard: its LRUs, slab of slots and interned names, the lists of
// dirty and changed keys, and how an evicted slot is retired and reused.
// Everything here is guarded by the shard's mutex.

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/sluicehq/sluice/bucket"
)

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
	// left is the cache's count of slots that left memory (Cache.left).
	left *atomic.Uint64
	// copies holds replica copies (Merge of keys not in lru or over) by
	// their cacheHash, apart from lru so that they never evict a key this
	// node decides: nil with Config.Copies 0. A copy whose cacheHash is
	// taken in copies by another key waits in pending instead, as every
	// copy does without copies. promoting is set while lookup moves a
	// copy to lru: its removal from copies is not an eviction.
	copies    *simplelru.LRU[uint32, uint32]
	promoting bool
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
	// byPart, with Config.Partitions, holds the first slot of each
	// partition's list of the shard's live slots (see link): a slot is
	// listed from newSlot until retire. partOf is Config.PartitionOf.
	byPart  map[uint32]uint32
	partOf  func(uint64) int
	limbo   []retired
	dirty   []*slot // slots to write at the next flush
	spare   []*slot // the previous dirty list, reused
	track   bool    // keep the changed list (Config.TrackChanges)
	changes []ref   // slots changed since the last TakeChanged
	names   []string
	nameIdx map[string]uint16

	// flushStarts counts the flushes that took this shard's dirty list,
	// flushDone is the count at the start of the last one that completed,
	// takes counts TakeChanged calls, from 1: see retired.
	flushStarts, flushDone, takes uint64

	// fences holds the keys Fence stopped deciding, with the Unix
	// nanosecond time until which Decide refuses them.
	fences map[Key]fence
	// fenceSweepAt is the size of fences at which Fence next drops the
	// expired fences (isFenced drops one only when its key is looked up
	// again, and most never are): twice the size after the last sweep, at
	// least minFenceSweep, so the map stays within twice the fences in
	// force and a sweep costs O(1) per Fence, amortised.
	fenceSweepAt int
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
	limit := sl.limit()
	if i := sl.nameIdx(); i != 0 {
		return Key{Name: s.names[i], Key: b, Limit: limit}
	}
	n := int(sl.meta >> nameLenShift & 0xffff)
	return Key{Name: b[:n], Key: b[n:], Limit: limit}
}

// is reports whether sl holds k.
func (s *shard) is(sl *slot, k Key) bool {
	if sl.limit() != k.Limit {
		return false
	}
	b := sl.bytes()
	if i := sl.nameIdx(); i != 0 {
		return b == k.Key && s.names[i] == k.Name
	}
	n := int(sl.meta >> nameLenShift & 0xffff)
	return len(b) == len(k.Name)+len(k.Key) && b[n:] == k.Key && b[:n] == k.Name
}

// newSlot returns a slot for an owned copy of k holding rec's state; h is
// the caller's hash of k.
func (s *shard) newSlot(h uint64, k Key, st bucket.State, version uint64) (uint32, *slot, error) {
	if len(k.Name)+len(k.Key) > maxKeyBytes {
		return 0, nil, fmt.Errorf("writeback: key of %d bytes is too long to cache", len(k.Name)+len(k.Key))
	}
	if k.Limit > MaxLimit {
		return 0, nil, fmt.Errorf("writeback: limit index %d is over %d", k.Limit, MaxLimit)
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
	meta := uint64(i)<<nameIdxShift | uint64(k.Limit)<<limitShift
	if i != 0 {
		b = strings.Clone(k.Key)
	} else {
		b = k.Name + k.Key
		meta |= uint64(len(k.Name)) << nameLenShift
	}
	idx, sl := s.slots.alloc()
	*sl = slot{version: version, meta: meta | uint64(len(b)), kp: unsafe.StringData(b)}
	sl.setState(st)
	if s.byPart != nil {
		s.list(idx, uint32(s.partOf(h)))
	}
	return idx, sl, nil
}

// list puts slot i first in the list of partition p (byPart).
func (s *shard) list(i, p uint32) {
	l := s.slots.link(i)
	head := s.byPart[p]
	*l = link{next: head, part: p}
	if head != 0 {
		s.slots.link(head).prev = i
	}
	s.byPart[p] = i
}

// unlist takes slot i out of its partition's list (byPart).
func (s *shard) unlist(i uint32) {
	l := s.slots.link(i)
	switch {
	case l.prev != 0:
		s.slots.link(l.prev).next = l.next
	case l.next != 0:
		s.byPart[l.part] = l.next
	default:
		delete(s.byPart, l.part)
	}
	if l.next != 0 {
		s.slots.link(l.next).prev = l.prev
	}
	*l = link{}
}

// cacheHash is the key under which the LRU holds a key: the caller's hash
// of the key, which is the same for every limit of a multi-limit key
// (SubKey), mixed with the key's Limit.
func cacheHash(h uint64, limit uint8) uint32 {
	if limit == 0 {
		return uint32(h)
	}
	h = (h ^ uint64(limit)) * 0x100000001b3
	return uint32(h ^ h>>32)
}

// onEvict keeps an evicted slot whose changes are unwritten and not yet
// expired in pending.
func (s *shard) onEvict(i uint32) {
	s.evictions++
	sl := s.slots.at(i)
	if sl.has(dirtyBit) && !sl.fresh(s.now) {
		s.pending[s.keyOf(sl)] = i
		s.kickIfPendingFull()
		return
	}
	sl.clear(queuedBit | dirtyBit) // its dirty reference, if any, is now a no-op
	s.retire(i)
}

// onEvictCopy is onEvict for the copies LRU: an evicted copy with an
// unwritten change waits in pending for its write, any other is dropped
// (the store holds it). Copies are not counted as evictions, which count
// the keys this node decides.
func (s *shard) onEvictCopy(i uint32) {
	if s.promoting {
		return
	}
	sl := s.slots.at(i)
	if sl.has(dirtyBit) {
		s.pending[s.keyOf(sl)] = i
		s.kickIfPendingFull()
		return
	}
	sl.clear(queuedBit)
	s.retire(i)
}

// kickIfPendingFull asks for a flush at once when pending reached
// pendingMax.
func (s *shard) kickIfPendingFull() {
	if len(s.pending) >= s.pendingMax {
		select {
		case s.kick <- struct{}{}:
		default: // a flush is already asked for
		}
	}
}

// retire puts the dropped slot i in limbo (see retired). When the list of
// changes is empty it cannot hold the slot, so the slot need not wait for a
// TakeChanged (which runs only once something changes).
func (s *shard) retire(i uint32) {
	s.left.Add(1)
	if s.byPart != nil {
		s.unlist(i)
	}
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
	if s.copies != nil {
		if i, ok := s.copies.Peek(ch); ok && s.is(s.slots.at(i), k) {
			// A copy read to be decided (a replica standing in, a pull)
			// becomes a key this node decides, as one from pending does.
			s.promoting = true
			s.copies.Remove(ch)
			s.promoting = false
			s.insert(ch, i, now)
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
