package ring

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Limits enforced by Config.Validate. They keep the precomputed tables small
// and the bounded-load arithmetic of consistent well inside float64 precision.
const (
	MaxPartitions        = 1 << 20
	MaxReplicationFactor = 16
	MaxVirtualNodes      = 4096
	MaxLoad              = 10.0
)

// Member is one node: Name is its unique memberlist node name, Addr its gRPC
// host:port. Only Name takes part in hashing; Addr is carried along so a
// lookup answers where to send a request.
type Member struct {
	Name string
	Addr string
}

// Config controls how partitions are placed. The zero value is not valid; start
// from DefaultConfig. Every node of a cluster must use the same Config, or the
// nodes disagree about owners.
type Config struct {
	// Partitions is the number of partitions keys are hashed into
	// (partition = Hash(name, key) % Partitions). Ownership moves whole
	// partitions. A prime spreads keys evenly. Default 7919; 1 ≤ Partitions ≤
	// MaxPartitions, and a table of N members needs Partitions ≥ N.
	Partitions int

	// ReplicationFactor is R: each partition lives on its owner plus R-1
	// replicas (fewer while the ring has fewer than R members). Default 2;
	// 1 ≤ R ≤ MaxReplicationFactor.
	ReplicationFactor int

	// Load is consistent's bounded-load factor: no member owns more than
	// ceil(floor(Partitions/members) × Load) partitions. Lower is better
	// balanced but moves more partitions when membership changes. Default 1.05;
	// 1 < Load ≤ MaxLoad.
	Load float64

	// VirtualNodes is the number of points each member has on the hash circle
	// (consistent's ReplicationFactor). More points move fewer partitions on a
	// membership change and make rebuilds slower. Default 100; 1 ≤
	// VirtualNodes ≤ MaxVirtualNodes.
	VirtualNodes int
}

// DefaultConfig returns the defaults measured in docs/ring.md: 7919
// partitions, R = 2, Load 1.05, 100 virtual nodes. With 3–64 members no
// member owns more than 1.06 × the mean share.
func DefaultConfig() Config {
	return Config{
		Partitions:        7919,
		ReplicationFactor: 2,
		Load:              1.05,
		VirtualNodes:      100,
	}
}

// Validate reports the first field that is out of range.
func (c Config) Validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > MaxPartitions:
		return fmt.Errorf("ring: Partitions = %d, want 1..%d", c.Partitions, MaxPartitions)
	case c.ReplicationFactor < 1 || c.ReplicationFactor > MaxReplicationFactor:
		return fmt.Errorf("ring: ReplicationFactor = %d, want 1..%d", c.ReplicationFactor, MaxReplicationFactor)
	case math.IsNaN(c.Load) || c.Load <= 1 || c.Load > MaxLoad:
		return fmt.Errorf("ring: Load = %v, want > 1 and ≤ %v", c.Load, MaxLoad)
	case c.VirtualNodes < 1 || c.VirtualNodes > MaxVirtualNodes:
		return fmt.Errorf("ring: VirtualNodes = %d, want 1..%d", c.VirtualNodes, MaxVirtualNodes)
	}
	return nil
}

// Hash is the one hash of a rate-limit key: xxhash64 of name + "\x00" + key.
// The partition is Hash % Partitions; other packages derive cache shards from
// the same value. It allocates nothing.
func Hash(name, key string) uint64 {
	n := len(name) + 1 + len(key)
	if n <= shortJoined {
		return hashJoined(name, key)
	}
	// Longer keys are joined in a stack buffer and hashed in one call,
	// which is faster than three streaming writes.
	if n <= hashBufLen {
		var buf [hashBufLen]byte
		copy(buf[:], name)
		buf[len(name)] = 0
		copy(buf[len(name)+1:], key)
		return xxhash.Sum64(buf[:n])
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(name)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(key)
	return d.Sum64()
}

// hashBufLen is the longest joined key Hash hashes from a stack buffer.
const hashBufLen = 128

// ErrDuplicateMember is returned (wrapped) by SetMembers when two members share a name.
var ErrDuplicateMember = errors.New("ring: duplicate member name")

// Ring holds the current Table and replaces it when membership changes. It is
// safe for concurrent use: lookups load the current Table atomically and never
// block; SetMembers calls are serialised.
type Ring struct {
	cfg   Config
	mu    sync.Mutex // serialises SetMembers and Build: the last SetMembers's table wins
	place placer     // guarded by mu
	table atomic.Pointer[Table]
}

// New returns an empty ring. It starts no goroutines.
func New(cfg Config) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Ring{cfg: cfg, place: placer{cfg: cfg}}
	r.table.Store(emptyTable(cfg))
	return r, nil
}

// Config returns the ring's configuration.
func (r *Ring) Config() Config { return r.cfg }

// SetMembers builds a new Table from the full member set (in any order) and
// makes it current. On error the current Table is kept.
func (r *Ring) SetMembers(ms []Member) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, err := r.build(ms)
	if err != nil {
		return err
	}
	r.table.Store(t)
	return nil
}

// Build returns the Table of the full member set ms (in any order) without
// making it current: the caller can prepare for it first, then SetTable.
// It is BuildTable's table, computed from the ring's last placement: its
// cost grows with the members that differ from the last set built (and
// linearly with the members), not with a rebuild from nothing.
func (r *Ring) Build(ms []Member) (*Table, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.build(ms)
}

func (r *Ring) build(ms []Member) (*Table, error) {
	members, err := sortedMembers(ms)
	if err != nil {
		return nil, err
	}
	return r.place.place(members)
}

// SetTable makes t, from Build, the current Table. Callers that mix Build
// and SetTable with SetMembers serialise them.
func (r *Ring) SetTable(t *Table) { r.table.Store(t) }

// Table returns the current immutable snapshot; never nil. Use one snapshot
// for a sequence of lookups that must agree with each other.
func (r *Ring) Table() *Table { return r.table.Load() }

// Owner returns the member owning the partition of hash; false on an empty ring.
func (r *Ring) Owner(hash uint64) (Member, bool) { return r.table.Load().Owner(hash) }

// Replicas appends the owner and replicas of hash's partition to dst; see Table.Replicas.
func (r *Ring) Replicas(hash uint64, dst []Member) []Member {
	return r.table.Load().Replicas(hash, dst)
}
