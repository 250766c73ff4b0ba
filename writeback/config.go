package writeback

import (
	"fmt"
	"log/slog"
	"time"
)

// Config configures a Cache. The zero value of a field means its default.
type Config struct {
	// Shards is the number of independently locked parts of the cache; a
	// power of two. Default 64.
	Shards int
	// Size is the most live entries held in memory across all shards; each
	// shard holds at most Size/Shards. Default 1_000_000.
	Size int
	// Copies is the most replica copies (Merge of keys this cache does
	// not decide) kept in memory after the flush that writes them, across
	// all shards, apart from Size: a copy held in memory takes the next
	// copy of its key without a store read. 0 keeps none: a copy stays in
	// memory only until its write, and each later copy of the key reads
	// the store first. DefaultConfig has DefaultCopies; a zero Copies is
	// not replaced by it.
	Copies int
	// FlushInterval is how often dirty entries are written to the store, as
	// one batch: one interval after the first change since the previous
	// flush, so a cache with nothing dirty does not flush. It bounds what a
	// crash loses. Default 1 s. A flush also
	// starts early when entries evicted before their write pile up in a
	// shard (1/8 of its size), so that churn does not grow memory past Size
	// by more than that until the interval ends.
	FlushInterval time.Duration
	// ExpiryInterval is how often expired records are deleted from the
	// store. Default 1 min.
	ExpiryInterval time.Duration
	// ExpiryBatch is the most store records one expiry pass examines; a
	// pass resumes where the previous one stopped. Default 100_000.
	ExpiryBatch int
	// Logger receives flush failures and corrupt records. Default
	// slog.Default().
	Logger *slog.Logger
	// TrackChanges makes the cache list the keys that Decide changed and
	// Adopt installed, for TakeChanged (the replication of cluster). Leave
	// it off when nothing calls TakeChanged: the list would only grow.
	TrackChanges bool
	// OnFlush, when set, is told of every flush that had records to write:
	// how many, how long the store's Write took and its error (nil when
	// they are durable). It runs on the flushing goroutine, without any
	// shard lock held, and must not block (metrics).
	OnFlush func(records int, took time.Duration, err error)
	// Partitions and PartitionOf, when Partitions is not zero, have the
	// cache keep its keys in memory listed by partition, for RangeIn:
	// PartitionOf(hash) is the partition, from 0 to Partitions-1, of a key
	// whose hash (the caller's, as passed to Decide and the other calls)
	// is hash. It must depend on the hash alone and never change. The
	// lists cost 12 bytes a key in memory.
	Partitions  int
	PartitionOf func(hash uint64) int
}

// Defaults.
const (
	DefaultShards         = 64
	DefaultSize           = 1_000_000
	DefaultCopies         = 1_000_000 // DefaultConfig's Copies; a zero Config keeps none
	DefaultFlushInterval  = time.Second
	DefaultExpiryInterval = time.Minute
	DefaultExpiryBatch    = 100_000
	maxShards             = 1 << 16
)

// DefaultConfig returns the defaults (Logger slog.Default()).
func DefaultConfig() Config {
	return Config{
		Shards:         DefaultShards,
		Size:           DefaultSize,
		Copies:         DefaultCopies,
		FlushInterval:  DefaultFlushInterval,
		ExpiryInterval: DefaultExpiryInterval,
		ExpiryBatch:    DefaultExpiryBatch,
		Logger:         slog.Default(),
	}
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Shards == 0 {
		c.Shards = d.Shards
	}
	if c.Size == 0 {
		c.Size = d.Size
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = d.FlushInterval
	}
	if c.ExpiryInterval == 0 {
		c.ExpiryInterval = d.ExpiryInterval
	}
	if c.ExpiryBatch == 0 {
		c.ExpiryBatch = d.ExpiryBatch
	}
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	return c
}

// Validate checks c after zero fields take their defaults.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Shards < 1 || c.Shards > maxShards || c.Shards&(c.Shards-1) != 0:
		return fmt.Errorf("writeback: Shards is %d, want a power of two from 1 to %d", c.Shards, maxShards)
	case c.Size < c.Shards:
		return fmt.Errorf("writeback: Size is %d, want at least Shards (%d)", c.Size, c.Shards)
	case c.Copies < 0:
		return fmt.Errorf("writeback: Copies is %d, want 0 or more", c.Copies)
	case c.FlushInterval < 0:
		return fmt.Errorf("writeback: FlushInterval is %v, want > 0", c.FlushInterval)
	case c.ExpiryInterval < 0:
		return fmt.Errorf("writeback: ExpiryInterval is %v, want > 0", c.ExpiryInterval)
	case c.ExpiryBatch < 0:
		return fmt.Errorf("writeback: ExpiryBatch is %d, want > 0", c.ExpiryBatch)
	case c.Partitions < 0 || c.Partitions > maxPartitions:
		return fmt.Errorf("writeback: Partitions is %d, want 0 to %d", c.Partitions, maxPartitions)
	case c.Partitions > 0 && c.PartitionOf == nil:
		return fmt.Errorf("writeback: Partitions is %d and PartitionOf is nil; set both or neither", c.Partitions)
	case c.Partitions == 0 && c.PartitionOf != nil:
		return fmt.Errorf("writeback: PartitionOf is set and Partitions is 0; set both or neither")
	}
	return nil
}
