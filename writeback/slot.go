package writeback

// The cache's slots: a counter's state and key bytes in slab chunks, and
// the bits that say what is pending for it.

import (
	"unsafe"

	"github.com/sluicehq/sluice/bucket"
)

// slot is the live state of one key: a bucket.State (its Algorithm kept in
// meta), the version and the key's bytes. It is 64 bytes because the cache
// holds a million of them: the key is a pointer to its bytes with the
// length in meta, and the name is an index into the shard's table of names
// (or, past that table's bound, stored in front of the key's bytes). Slots
// live in the shard's slab and are named by 32-bit indices, which keeps the
// LRU's list element at 64 bytes too. A slot is reached from exactly one of
// its shard's LRU, overflow LRU, copies LRU or pending map; the dirty and
// changed lists point to it. Every field is guarded by the shard's mutex.
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
	algShift     = 48        // bits 48–51: the State's Algorithm
	epochShift   = 52        // bits 52–55: the State's Epoch
	limitShift   = 56        // bits 56–60: the Key's Limit (MaxLimit is 31)
	limitMask    = 0x1f
	changedBit   = 1 << 61 // on shard.changed, not yet taken by TakeChanged
	queuedBit    = 1 << 62 // on shard.dirty, not yet copied by a flush
	dirtyBit     = 1 << 63 // has a change the store may not hold yet
	maxKeyBytes  = keyLenMask
)

func (sl *slot) has(bit uint64) bool { return sl.meta&bit != 0 }
func (sl *slot) set(bit uint64)      { sl.meta |= bit }
func (sl *slot) clear(bit uint64)    { sl.meta &^= bit }

// bytes returns the bytes the slot keeps at kp.
func (sl *slot) bytes() string { return unsafe.String(sl.kp, int(sl.meta&keyLenMask)) }

func (sl *slot) nameIdx() int { return int(sl.meta >> nameIdxShift & 0xffff) }

// limit returns the slot's Key.Limit.
func (sl *slot) limit() uint8 { return uint8(sl.meta >> limitShift & limitMask) }

func (sl *slot) state() bucket.State {
	var st bucket.State
	sl.loadState(&st)
	return st
}

// loadState writes sl's state to *st field by field (a State returned by
// value is copied whole, which stalls store forwarding on the hot path).
func (sl *slot) loadState(st *bucket.State) {
	st.Algorithm = bucket.Algorithm(sl.meta >> algShift & 0x0f)
	st.Epoch = uint8(sl.meta >> epochShift & bucket.MaxEpoch)
	st.Start, st.Count, st.Prev, st.Expires, st.Ext = sl.start, sl.count, sl.prev, sl.expires, sl.ext
}

func (sl *slot) setState(st bucket.State) {
	sl.start, sl.count, sl.prev, sl.expires, sl.ext = st.Start, st.Count, st.Prev, st.Expires, st.Ext
	sl.meta = sl.meta&^(0xff<<algShift) | uint64(st.Algorithm&0x0f)<<algShift | uint64(st.Epoch&bucket.MaxEpoch)<<epochShift
}

// differs reports whether st is not the state sl holds. (Field by field:
// see bucket.DecideWith on whole-struct copies.)
func (sl *slot) differs(st *bucket.State) bool {
	return st.Start != sl.start || st.Count != sl.count || st.Prev != sl.prev || st.Expires != sl.expires ||
		st.Ext != sl.ext || uint64(st.Algorithm)|uint64(st.Epoch)<<(epochShift-algShift) != sl.meta>>algShift&0xff
}

func (sl *slot) fresh(now int64) bool { return bucket.FreshAt(sl.expires, now) }

// ref is a slot on a shard's changed list, with the caller's hash of its key.
type ref struct {
	h  uint64
	sl *slot
}

// slab holds a shard's slots in fixed chunks, so that a slot never moves,
// addressed by 32-bit indices; index 0 is never used. With linked, each
// chunk of slots has a chunk of links beside it (see link).
type slab struct {
	chunks [][]slot
	links  [][]link
	linked bool
	free   []uint32
	next   uint32 // the next index to hand out (after checking it)
}

// link is a live slot's place in its shard's list of the live slots of its
// partition (Config.Partitions; shard.byPart): the slots before and after
// it (0: none) and the partition. It lives beside the slot, not in it, so
// that a cache that lists nothing by partition does not pay for it and a
// slot keeps its 64 bytes.
type link struct{ prev, next, part uint32 }

const (
	chunkBits = 8
	chunkMask = 1<<chunkBits - 1
	// chunkSlots is one less than a power of two: a chunk of 255 slots
	// and the 8-byte header Go gives large objects with pointers fill a
	// 16 KiB size class (256 slots would take an 18 KiB one).
	chunkSlots = chunkMask
)

func (b *slab) at(i uint32) *slot { return &b.chunks[i>>chunkBits][i&chunkMask] }

// link returns slot i's link (linked slabs only).
func (b *slab) link(i uint32) *link { return &b.links[i>>chunkBits][i&chunkMask] }

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
		if b.linked {
			b.links = append(b.links, make([]link, chunkSlots))
		}
	}
	b.next++
	return i, b.at(i)
}

// release zeroes slot i (dropping what it points to) for reuse.
func (b *slab) release(i uint32) {
	*b.at(i) = slot{}
	b.free = append(b.free, i)
}
