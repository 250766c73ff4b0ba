package ring

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// Table is an immutable placement of partitions on members: for every
// partition, its owner and replicas. It is safe for concurrent use; lookups
// take no lock and allocate nothing.
//
// It keeps 2 bytes per partition: the owner's index. A partition's
// replicas are the members after its owner in the order of their name
// hashes, which the table keeps once (n entries), so a table of 65,521
// partitions is 128 KiB whatever the replication factor. Moves keep the
// tables of the last MoveWindow's membership changes, so their size is
// what a burst of changes costs in memory.
type Table struct {
	partitions uint64   // Config.Partitions
	recip      uint64   // floor(2^64 / partitions), for mod
	r          int      // owner and replicas per partition: min(ReplicationFactor, len(members))
	members    []Member // sorted by name
	owner      []uint16 // owner[p]: index into members of p's owner
	byHash     []uint16 // members' indexes in the order of their name hashes
	pos        []uint16 // pos[i]: the place of members[i] in byHash
	owned      []int32  // owned[i]: partitions owned by members[i]
}

// MaxMembers is the most members a table holds: owners are 2-byte
// indexes.
const MaxMembers = 1 << 16

func emptyTable(cfg Config) *Table {
	return &Table{partitions: uint64(cfg.Partitions), recip: reciprocal(cfg.Partitions)}
}

// cmember is the member type handed to consistent: its name.
type cmember string

func (m cmember) String() string { return string(m) }

// hasher is consistent's Hasher: xxhash64, the same function as Hash.
type hasher struct{}

func (hasher) Sum64(b []byte) uint64 { return xxhash.Sum64(b) }

// BuildTable places cfg.Partitions partitions on ms (any order) with
// consistent's bounded-load hashing, from nothing. The same cfg and member
// names give the same table on every node. Names must be unique and
// non-empty. Ring.SetMembers and Ring.Build compute the same table from
// the ring's previous placement, much faster (place.go).
func BuildTable(cfg Config, ms []Member) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	members, err := sortedMembers(ms)
	if err != nil {
		return nil, err
	}
	n := len(members)
	if n == 0 {
		return emptyTable(cfg), nil
	}
	if err := checkRoom(cfg, n); err != nil {
		return nil, err
	}
	owners, err := placeOwners(cfg, members)
	if err != nil {
		return nil, err
	}
	return newTable(cfg, members, owners), nil
}

// sortedMembers returns a copy of ms sorted by name, refusing empty and
// duplicate names.
func sortedMembers(ms []Member) ([]Member, error) {
	byName := func(a, b Member) int { return cmp.Compare(a.Name, b.Name) }
	members := slices.Clone(ms)
	if !slices.IsSortedFunc(members, byName) {
		slices.SortFunc(members, byName)
	}
	for i, m := range members {
		if m.Name == "" {
			return nil, fmt.Errorf("ring: member with empty name (addr %q)", m.Addr)
		}
		if i > 0 && members[i-1].Name == m.Name {
			return nil, fmt.Errorf("%w: %q", ErrDuplicateMember, m.Name)
		}
	}
	return members, nil
}

// checkRoom says why n members cannot hold cfg's partitions under its
// load bound (consistent panics then), or returns nil.
func checkRoom(cfg Config, n int) error {
	if n > MaxMembers {
		return fmt.Errorf("ring: %d members, more than %d", n, MaxMembers)
	}
	perMember := math.Ceil(float64(cfg.Partitions/n) * cfg.Load)
	if int(perMember)*n < cfg.Partitions {
		return fmt.Errorf("ring: %d members cannot hold %d partitions at Load %v (at most %v each): use more partitions or a higher load",
			n, cfg.Partitions, cfg.Load, perMember)
	}
	return nil
}

// newTable makes the table of members (sorted by name) whose partition p
// is owned by members[owners[p]]. Replicas follow
// consistent.GetClosestNForPartition: members ordered by the hash of their
// name; a partition's replicas are the members after its owner in that
// order. Ties are broken by name so the order is total.
func newTable(cfg Config, members []Member, owners []int32) *Table {
	n := len(members)
	type named struct {
		hash uint64
		i    int32 // index into members: ties go by name
	}
	order := make([]named, n)
	for i, m := range members {
		order[i] = named{xxhash.Sum64String(m.Name), int32(i)}
	}
	slices.SortFunc(order, func(a, b named) int {
		if c := cmp.Compare(a.hash, b.hash); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	})
	t := &Table{
		partitions: uint64(cfg.Partitions),
		recip:      reciprocal(cfg.Partitions),
		r:          min(cfg.ReplicationFactor, n),
		members:    members,
		owner:      make([]uint16, cfg.Partitions),
		byHash:     make([]uint16, n),
		pos:        make([]uint16, n),
		owned:      make([]int32, n),
	}
	for k, o := range order {
		t.byHash[k] = uint16(o.i)
		t.pos[o.i] = uint16(k)
	}
	for p, o := range owners {
		t.owned[o]++
		t.owner[p] = uint16(o)
	}
	return t
}

// placeOwners asks consistent for the owner of every partition and returns
// them as indexes into members (sorted by name, so adding them in this order
// makes consistent's result independent of the caller's order).
func placeOwners(cfg Config, members []Member) (owners []int32, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("ring: consistent could not place partitions: %v", v)
		}
	}()
	index := make(map[string]int32, len(members))
	cms := make([]consistent.Member, len(members))
	for i, m := range members {
		index[m.Name] = int32(i)
		cms[i] = cmember(m.Name)
	}
	c := consistent.New(cms, consistentConfig(cfg))
	owners = make([]int32, cfg.Partitions)
	for p := range owners {
		o := c.GetPartitionOwner(p)
		if o == nil {
			return nil, fmt.Errorf("ring: consistent left partition %d without owner", p)
		}
		owners[p] = index[o.String()]
	}
	return owners, nil
}

func consistentConfig(cfg Config) consistent.Config {
	return consistent.Config{
		Hasher:            hasher{},
		PartitionCount:    cfg.Partitions,
		ReplicationFactor: cfg.VirtualNodes,
		Load:              cfg.Load,
	}
}

// Partition returns the partition of a key hash (see Hash): hash % Partitions.
func (t *Table) Partition(hash uint64) int { return int(t.mod(hash)) }

// reciprocal returns floor(2^64 / n) for n ≥ 2 (Config.Validate), 0 for
// smaller n.
func reciprocal(n int) uint64 {
	if n < 2 {
		return 0
	}
	q, _ := bits.Div64(1, 0, uint64(n))
	return q
}

// mod returns hash % t.partitions without a division instruction, which
// costs tens of cycles and sits on the path of every check: with m =
// floor(2^64/n), the high word of hash×m is floor(hash/n) or one less, so
// one subtraction corrects the remainder.
func (t *Table) mod(hash uint64) uint64 {
	if t.recip == 0 {
		return hash % t.partitions
	}
	q, _ := bits.Mul64(hash, t.recip)
	r := hash - q*t.partitions
	if r >= t.partitions {
		r -= t.partitions
	}
	return r
}

// Partitions returns the number of partitions.
func (t *Table) Partitions() int { return int(t.partitions) }

// Owner returns the member owning the partition of hash; false when the table
// has no members.
func (t *Table) Owner(hash uint64) (Member, bool) {
	if t.r == 0 {
		return Member{}, false
	}
	return t.members[t.owner[t.mod(hash)]], true
}

// Replicas appends to dst the owner of hash's partition followed by its
// replicas: min(ReplicationFactor, Len()) distinct members, nothing when the
// table is empty. It allocates nothing when dst has room.
func (t *Table) Replicas(hash uint64, dst []Member) []Member {
	return t.appendRow(int(t.mod(hash)), dst)
}

// PartitionOwner returns the owner of partition p; false when the table is
// empty or p is out of range.
func (t *Table) PartitionOwner(p int) (Member, bool) {
	if t.r == 0 || p < 0 || p >= int(t.partitions) {
		return Member{}, false
	}
	return t.members[t.owner[p]], true
}

// PartitionReplicas is Replicas for partition p; it appends nothing when p is
// out of range.
func (t *Table) PartitionReplicas(p int, dst []Member) []Member {
	if p < 0 || p >= int(t.partitions) {
		return dst
	}
	return t.appendRow(p, dst)
}

// appendRow appends p's owner and replicas: the owner, then the members
// after it in the order of name hashes, wrapping around.
func (t *Table) appendRow(p int, dst []Member) []Member {
	if t.r == 0 {
		return dst
	}
	n := len(t.byHash)
	at := int(t.pos[t.owner[p]])
	for range t.r {
		dst = append(dst, t.members[t.byHash[at]])
		if at++; at == n {
			at = 0
		}
	}
	return dst
}

// Index returns the index of the member named name (members sorted by
// name, as Members gives them), -1 when there is none. With
// PartitionOwnerIndex and InRow, it lets a caller that walks every
// partition compare one member by number rather than by name.
func (t *Table) Index(name string) int {
	i, ok := slices.BinarySearchFunc(t.members, name, func(m Member, name string) int { return cmp.Compare(m.Name, name) })
	if !ok {
		return -1
	}
	return i
}

// PartitionOwnerIndex returns the index (Index) of partition p's owner, -1
// when the table is empty or p is out of range.
func (t *Table) PartitionOwnerIndex(p int) int {
	if t.r == 0 || p < 0 || p >= int(t.partitions) {
		return -1
	}
	return int(t.owner[p])
}

// InRow reports whether member i (Index) is in partition p's row, its
// owner or one of its replicas (PartitionReplicas), without making the
// row.
func (t *Table) InRow(p, i int) bool {
	if t.r == 0 || p < 0 || p >= int(t.partitions) || i < 0 || i >= len(t.members) {
		return false
	}
	n := len(t.byHash)
	d := int(t.pos[i]) - int(t.pos[t.owner[p]])
	if d < 0 {
		d += n
	}
	return d < t.r
}

// Has reports whether a member is named name. It allocates nothing.
func (t *Table) Has(name string) bool {
	_, ok := slices.BinarySearchFunc(t.members, name, func(m Member, name string) int { return cmp.Compare(m.Name, name) })
	return ok
}

// HasAddr reports whether a member of t has the address addr (a linear
// search: for the rare paths that know a node by its address only).
func (t *Table) HasAddr(addr string) bool {
	return slices.ContainsFunc(t.members, func(m Member) bool { return m.Addr == addr })
}

// Members returns a copy of the members, sorted by name.
func (t *Table) Members() []Member { return slices.Clone(t.members) }

// Shares returns, for each member name, the fraction of partitions it owns.
// The fractions sum to 1 (an empty map for an empty table).
func (t *Table) Shares() map[string]float64 {
	s := make(map[string]float64, len(t.members))
	for i, m := range t.members {
		s[m.Name] = float64(t.owned[i]) / float64(t.partitions)
	}
	return s
}

// Len returns the number of members.
func (t *Table) Len() int { return len(t.members) }
