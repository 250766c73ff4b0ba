// Package overrides holds the limits operators set at run time for one key
// of a name, or for every key of a name that starts with a prefix
// (`sluice overrides set`). An override takes precedence over the limits
// a check carries inline and over the rules file.
//
// The table is a last-writer-wins map: each record carries a version (the
// setting node's hybrid clock: its Unix ns, or one more than the version it
// replaces) and the setting node's name, which breaks ties, so every node
// that has seen the same records holds the same table whatever the order
// they arrived in. A deletion is a record too (a tombstone), so that a node
// that missed it cannot bring the override back. Records travel between
// nodes by gossip (package cluster) and are kept on disk (WriteFile); this
// package knows neither.
package overrides

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
)

// Bounds on the table and its records.
const (
	// MaxOverrides is the most overrides in force at once: a set of a new
	// target beyond it is refused.
	MaxOverrides = 1000
	// MaxRecords bounds what the table keeps, tombstones included; the
	// oldest tombstones go first (a node that missed a deletion made that
	// long ago may then bring the override back).
	MaxRecords = 2 * MaxOverrides
	// MaxNoteLen bounds an override's note and its SetBy.
	MaxNoteLen = 256
	// MaxEncodedLen bounds one record's encoding, so that it fits one
	// gossip packet.
	MaxEncodedLen = 1024
)

// Target is what an override applies to: the key Key of Name, or with
// Prefix every key of Name that starts with Key ("" for every key).
type Target struct {
	Name   string
	Key    string
	Prefix bool
}

func (t Target) String() string {
	if t.Prefix {
		return fmt.Sprintf("%s keys %q*", t.Name, t.Key)
	}
	return fmt.Sprintf("%s key %q", t.Name, t.Key)
}

// Override is one record of the table.
type Override struct {
	Target
	// Limits are in force for the target's keys, as a rule's are: the
	// first, and the others decided atomically with it. Empty on a
	// deletion.
	Limits  []bucket.Limit
	Deleted bool
	// Version orders the records of one target: the larger wins, and on
	// equal versions the larger Origin.
	Version uint64
	Origin  string // the node that set it
	SetBy   string // who asked, as the node's audit line names the caller
	Note    string
	SetAt   int64 // Unix ns on Origin's clock
}

// newer reports whether a outranks b (same target).
func newer(a, b Override) bool {
	if a.Version != b.Version {
		return a.Version > b.Version
	}
	return a.Origin > b.Origin
}

// Validate reports what is wrong with o, naming the field: its target
// (name and key as a check's; a prefix may be empty), its limits (as a
// check's limits, at least one and at most bucket.MaxLimitsPerRequest,
// none on a deletion), its note and origin, and its encoded size.
func (o *Override) Validate() error {
	key := o.Key
	if o.Prefix && key == "" {
		key = "*" // every key of the name
	}
	if err := bucket.ValidateKey(o.Name, key); err != nil {
		return err
	}
	switch {
	case o.Deleted && len(o.Limits) > 0:
		return errors.New("a deletion carries no limits")
	case !o.Deleted && len(o.Limits) == 0:
		return errors.New("limits: an override needs at least one limit")
	case len(o.Note) > MaxNoteLen || !utf8.ValidString(o.Note):
		return fmt.Errorf("note: at most %d bytes of UTF-8", MaxNoteLen)
	case len(o.SetBy) > MaxNoteLen || !utf8.ValidString(o.SetBy):
		return fmt.Errorf("set_by: at most %d bytes of UTF-8", MaxNoteLen)
	case o.Origin == "" || len(o.Origin) > bucket.MaxNameLen:
		return errors.New("origin: the setting node's name is missing or too long")
	}
	if !o.Deleted {
		r := check.Request{Name: o.Name, Key: key, More: o.Limits}
		if err := r.Validate(); err != nil {
			return err
		}
		for i := range o.Limits {
			if o.Limits[i].Limit == 0 {
				return fmt.Errorf("limits[%d]: limit is 0: an override gives its limits, it does not defer to the rules", i)
			}
		}
	}
	if n := len(encodeOne(*o)); n > MaxEncodedLen {
		return fmt.Errorf("the override encodes to %d bytes, more than %d: shorten its note or key, or give fewer limits", n, MaxEncodedLen)
	}
	return nil
}

// Table is the overrides a node knows. Lookups read an immutable snapshot
// without a lock; changes are serialized. Safe for concurrent use.
type Table struct {
	mu   sync.Mutex
	recs map[Target]Override
	live int
	snap atomic.Pointer[snapshot]
}

// snapshot is what Lookup reads: per name, exact keys and prefixes, the
// longest prefix first.
type snapshot struct {
	exact  map[string]map[string][]bucket.Limit
	prefix map[string][]prefixRule
}

type prefixRule struct {
	prefix string
	limits []bucket.Limit
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{recs: make(map[Target]Override)}
}

// ErrFull refuses a set of a new target when MaxOverrides are in force.
var ErrFull = fmt.Errorf("%d overrides are in force, the most a cluster holds: delete one first", MaxOverrides)

// Apply installs o unless the table holds a record of its target that
// outranks it or is the same, and reports whether the table changed. A
// record that does not validate is refused with its error and changes
// nothing; so is a new override past MaxOverrides (ErrFull) or a record
// past MaxRecords when no tombstone can make room.
func (t *Table) Apply(o Override) (bool, error) {
	if err := o.Validate(); err != nil {
		return false, fmt.Errorf("override of %v: %w", o.Target, err)
	}
	o.Limits = slices.Clone(o.Limits)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.apply(o)
}

// Stamp gives o the version of a change of its target made at now (now,
// or one more than the record held when that is not older) and applies
// it, in one hold of the lock, so that two changes of one target on one
// node never share a version. It returns o as applied.
func (t *Table) Stamp(o Override, now int64) (Override, error) {
	o.Limits = slices.Clone(o.Limits)
	t.mu.Lock()
	defer t.mu.Unlock()
	o.Version = uint64(max(now, 0))
	if held, ok := t.recs[o.Target]; ok && held.Version >= o.Version {
		o.Version = held.Version + 1
	}
	// Validated with the version it will travel with: its digits count
	// toward MaxEncodedLen, and a record over it would be refused by
	// every peer.
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("override of %v: %w", o.Target, err)
	}
	_, err := t.apply(o)
	return o, err
}

// TruncateUTF8 cuts s to at most n bytes, at a character boundary (a
// caller's name as SetBy, which may be a long certificate subject).
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// apply is Apply with o valid and t.mu held.
func (t *Table) apply(o Override) (bool, error) {
	held, ok := t.recs[o.Target]
	if ok && !newer(o, held) {
		return false, nil
	}
	live := t.live
	if ok && !held.Deleted {
		live--
	}
	if !o.Deleted {
		live++
	}
	if live > MaxOverrides && !o.Deleted {
		return false, ErrFull
	}
	if !ok && len(t.recs) >= MaxRecords && !t.dropOldestTombstone() {
		return false, fmt.Errorf("the table holds %d records, the most it keeps", MaxRecords)
	}
	t.recs[o.Target] = o
	t.live = live
	t.rebuild()
	return true, nil
}

// dropOldestTombstone drops the deletion set longest ago; false when there
// is none. t.mu is held.
func (t *Table) dropOldestTombstone() bool {
	var oldest *Override
	for _, r := range t.recs {
		if r.Deleted && (oldest == nil || r.SetAt < oldest.SetAt) {
			oldest = &r
		}
	}
	if oldest == nil {
		return false
	}
	delete(t.recs, oldest.Target)
	return true
}

// rebuild makes the lookup snapshot from the records; t.mu is held.
func (t *Table) rebuild() {
	if t.live == 0 {
		t.snap.Store(nil)
		return
	}
	s := &snapshot{exact: map[string]map[string][]bucket.Limit{}, prefix: map[string][]prefixRule{}}
	for _, r := range t.recs {
		switch {
		case r.Deleted:
		case r.Prefix:
			s.prefix[r.Name] = append(s.prefix[r.Name], prefixRule{r.Key, r.Limits})
		default:
			if s.exact[r.Name] == nil {
				s.exact[r.Name] = map[string][]bucket.Limit{}
			}
			s.exact[r.Name][r.Key] = r.Limits
		}
	}
	for _, ps := range s.prefix {
		slices.SortFunc(ps, func(a, b prefixRule) int { return cmp.Compare(len(b.prefix), len(a.prefix)) })
	}
	t.snap.Store(s)
}

// Lookup returns the limits an override sets for key of name: the
// override of that key, else that of the longest prefix of it. The
// slice is shared: callers must not write it.
func (t *Table) Lookup(name, key string) ([]bucket.Limit, bool) {
	s := t.snap.Load()
	if s == nil {
		return nil, false
	}
	if ls, ok := s.exact[name][key]; ok {
		return ls, true
	}
	for _, p := range s.prefix[name] {
		if strings.HasPrefix(key, p.prefix) {
			return p.limits, true
		}
	}
	return nil, false
}

// Get returns the record of target, tombstone or not.
func (t *Table) Get(target Target) (Override, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.recs[target]
	return o, ok
}

// List returns the overrides in force of name ("" for every name),
// ordered by name, then exact keys before prefixes, then key.
func (t *Table) List(name string) []Override {
	t.mu.Lock()
	out := make([]Override, 0, t.live)
	for _, r := range t.recs {
		if !r.Deleted && (name == "" || r.Name == name) {
			out = append(out, r)
		}
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b Override) int {
		if c := cmp.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		if a.Prefix != b.Prefix {
			if a.Prefix {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out
}

// Records returns every record, tombstones included, for a peer or the
// disk.
func (t *Table) Records() []Override {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Override, 0, len(t.recs))
	for _, r := range t.recs {
		out = append(out, r)
	}
	return out
}

// Live returns how many overrides are in force.
func (t *Table) Live() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.live
}
