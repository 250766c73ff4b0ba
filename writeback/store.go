package writeback

import (
	"errors"
	"log/slog"
)

// ErrStoreFull is wrapped by the error of a write the store refused because
// its disk has too little free space for the batch plus the reserve the
// engine needs for its own work (DefaultStoreReserve). Nothing was written;
// the caller keeps the records and tries again later.
var ErrStoreFull = errors.New("not enough free disk space for the store")

// DefaultStoreReserve is the free space, in bytes, the default store keeps
// on its disk beyond a batch and the size of its tables: room for pebble's
// own writes after the last accepted batch (a new write-ahead log, which
// pebble preallocates at 4.4 MiB, a memtable flush of up to 4 MiB, the
// MANIFEST). The size of the tables is kept free on top of it, so that a
// compaction, which writes its output before it deletes its input, always
// fits. docs/store.md has the measurements.
const DefaultStoreReserve = 16 << 20

// Store is the durable store the Cache flushes to and loads from.
//
// Concurrency: every method except Close is safe for concurrent use. The
// Cache calls Load from many goroutines at once (one per missing key, never
// while holding a shard lock), and Write and DeleteExpired from its
// background loops, one call at a time. A Write and a DeleteExpired never
// lose each other's effects: a record written with a live state is not
// deleted by an expiry pass that examined the older, expired one. Close is
// called once, after every other call has returned; no call follows it.
type Store interface {
	// Load returns the record of k. A missing record is (zero, false, nil);
	// so is a corrupt one (bad checksum, bad encoding, unknown format, or
	// in a part of a file the engine finds corrupt), which Load logs with
	// the store's path (and file) and the key and counts. An I/O failure
	// is an error.
	Load(k Key) (Record, bool, error)
	// Write stores recs as one atomic batch that is durable (synced to
	// disk) when Write returns nil. A failed Write stores none of them;
	// one refused for lack of disk space wraps ErrStoreFull.
	Write(recs []Record) error
	// DeleteExpired examines at most max records, resuming after the last
	// one the previous call examined and wrapping around at the end, and
	// deletes those whose State is Fresh(now) (now in Unix nanoseconds) and
	// those that are corrupt. It returns how many it deleted.
	DeleteExpired(now int64, max int) (int, error)
	// ForEach calls fn for every record in key order until fn returns
	// false. Corrupt records are logged, counted and skipped; so is a
	// corrupt file, whose key range the scan steps over.
	ForEach(fn func(Record) bool) error
	// Close releases the store.
	Close() error
}

// PartitionScanner is a Store that keeps the records of each partition
// (Partitioning) together, and so can read those of a few partitions
// without reading the others.
type PartitionScanner interface {
	// ForEachIn is ForEach over the records of the partitions p with
	// parts[p] true.
	ForEachIn(parts []bool, fn func(Record) bool) error
}

// Partitioning groups a store's records: Of(k) is the partition of k, in
// [0, Count). A ring change reads only the records of the partitions that
// moved (Cache.RangeStoredOnly), so the store's grouping is the ring's.
// Of must be a pure function of the key.
type Partitioning struct {
	Count int
	Of    func(Key) int
}

// maxPartitions bounds Partitioning.Count (the ring allows 1<<20).
const maxPartitions = 1 << 24

// OpenStore opens (creating if needed) the default store under dir: a
// pebble database in dir itself (see docs/store.md for why pebble). It
// locks dir (dir/sluice.lock): a dir another store has open is refused.
// When the store's files cannot be read as a store (corrupt), they are
// moved into dir/unreadable-<time>, the error is logged with both paths,
// and an empty store is opened in their place. A store that cannot be
// opened for other reasons (permissions, a full or read-only disk, I/O
// errors) gives an error naming the path. logger nil means slog.Default().
//
// The store never lets its disk fill up: before each batch it checks the
// free space and refuses the batch (ErrStoreFull) when the batch and
// DefaultStoreReserve plus the size of its tables would not fit, because
// pebble treats a failed write-ahead-log or MANIFEST write as fatal and
// panics. It implements CheckSpace (see Cache) to ask without a batch.
func OpenStore(dir string, logger *slog.Logger) (Store, error) {
	return openPebble(dir, logger)
}

// OpenPartitionedStore is OpenStore with the records grouped by parts
// (the store then implements PartitionScanner). A store whose records were
// grouped otherwise (another partition count, or a store written before
// stores were grouped) has them rewritten while it opens, logged with how
// many and how long; a rewrite that fails (a full disk) is logged and
// tried again at the next open, and the records it did not reach are not
// found meanwhile. docs/store.md has the layout.
func OpenPartitionedStore(dir string, logger *slog.Logger, parts Partitioning) (Store, error) {
	return openPebbleParts(dir, logger, parts)
}
