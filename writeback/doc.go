// Package writeback owns the live counter states of one node: a sharded LRU
// cache of bucket.State values, which of them changed since they were last
// written (dirty tracking), writing them to and loading them from a durable
// store on local disk, and deleting expired records from that store.
//
// # Shape
//
// A Cache is N shards (Config.Shards, a power of two). Each shard is a
// sync.Mutex, a simplelru.LRU of live entries, a pending map of evicted
// entries whose changes are not yet written, and a dirty list. The caller
// hashes each Key once (the same 64-bit hash it routes with); the top bits
// of that hash pick the shard. Names are interned per shard, key strings are
// copied on insert, so a check that hits holds no caller memory and
// allocates nothing. A cache made with Config.Partitions also lists each
// shard's live entries by the caller's partition of their hash (a link of
// 12 bytes beside each entry), so that RangeIn visits the keys of a few
// partitions without walking the rest.
//
// Every change bumps the entry's Version (max(Version+1, now), so versions
// keep growing even across expiry and restarts) and puts it on the dirty
// list. Flush copies the dirty entries under each shard's lock, in chunks,
// writes them outside every lock as one durable batch (Store.Write), and
// then marks them written unless they changed meanwhile. An entry the LRU
// evicts while it has unwritten, unexpired changes waits in its shard's
// pending map until a flush writes it; a miss looks in pending before the
// store. A miss reads the store without holding the shard lock and
// re-checks after re-locking; a record whose state is Fresh(now) counts as
// absent.
//
// The default Store (OpenStore) is a pebble database; docs/store.md records
// the benchmark that chose it over bbolt. Stored values carry a format byte,
// the Version, the bucket.State encoding and a crc32c; a corrupt record is
// logged with the store's path and the key, counted and treated as absent.
//
// # Lifecycle and concurrency
//
// New starts nothing. Start(ctx) starts two goroutines: the flush loop
// (every Config.FlushInterval) and the expiry loop (every
// Config.ExpiryInterval, at most Config.ExpiryBatch records per pass). They
// stop when ctx ends or at Close. Close stops them, waits for them, refuses
// further calls with ErrClosed, writes every dirty and pending entry and
// closes the store. Flush is exported so that tests and shutdown code can
// run it on demand; flushes run one at a time.
//
// Decide, Get, Merge, Flush, Len and Stats are safe for concurrent use. A
// check holds one shard lock for a map lookup and the bucket decision; it
// never waits on disk, except that a miss reads the store (without the
// lock). A failed flush keeps every entry dirty and counts the failure;
// the store is then unwritable (StoreState) until a flush succeeds, which is
// logged once each way and every minute in between. While it is, evicted
// dirty entries stay in memory past Size (nothing is dropped), a flush is
// tried only every FlushInterval (a store with CheckSpace is asked first,
// so a full disk costs no copying), and expiry passes wait.
//
// The default store refuses a batch (ErrStoreFull) when its disk would be
// left with less than DefaultStoreReserve plus the size of its tables:
// pebble panics when a write-ahead-log or MANIFEST write fails, so the
// store stops before pebble could meet a full disk.
//
// # Units and defaults
//
// Times (now, State fields) are Unix nanoseconds; intervals are
// time.Duration. Defaults: 64 shards, 1,000,000 live entries, flush every
// 1 s, expiry pass every 1 min over at most 100,000 records, slog.Default().
package writeback
