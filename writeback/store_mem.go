package writeback

import (
	"errors"
	"slices"
	"sync"
)

// MemStore is a Store in memory, for tests that run nodes inside a
// testing/synctest bubble (pebble's background work does not belong in
// one) or that simulate a crash: Clone is what the disk held at the crash,
// to hand to the restarted node. Every Write is "durable" at once. Safe
// for concurrent use; Close only marks it closed (a later call fails), its
// records stay readable through Clone.
type MemStore struct {
	mu     sync.Mutex
	recs   map[Key]Record
	cursor Key // DeleteExpired resumes after this key
	closed bool
}

var _ Store = (*MemStore)(nil)

// errMemClosed is returned by the calls made after Close.
var errMemClosed = errors.New("writeback: memory store is closed")

// NewMemStore returns an empty memory store.
func NewMemStore() *MemStore { return &MemStore{recs: make(map[Key]Record)} }

// Clone returns an open copy of the records, as a disk would hold them
// after the process died now.
func (m *MemStore) Clone() *MemStore {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := NewMemStore()
	for k, r := range m.recs {
		c.recs[k] = r
	}
	return c
}

// Len returns the number of records.
func (m *MemStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs)
}

// Load returns the record of k.
func (m *MemStore) Load(k Key) (Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Record{}, false, errMemClosed
	}
	r, ok := m.recs[k]
	return r, ok, nil
}

// Write stores recs.
func (m *MemStore) Write(recs []Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errMemClosed
	}
	for _, r := range recs {
		m.recs[r.Key] = r
	}
	return nil
}

// DeleteExpired examines at most max records in key order after the last
// one examined, wrapping around, and deletes those that are Fresh at now.
func (m *MemStore) DeleteExpired(now int64, max int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, errMemClosed
	}
	keys := m.sortedKeys()
	start, _ := slices.BinarySearchFunc(keys, m.cursor, compareKeys)
	if start < len(keys) && keys[start] == m.cursor {
		start++
	}
	deleted := 0
	for i := 0; i < max && i < len(keys); i++ {
		k := keys[(start+i)%len(keys)]
		m.cursor = k
		r := m.recs[k]
		if r.State.Fresh(now) {
			delete(m.recs, k)
			deleted++
		}
	}
	return deleted, nil
}

// ForEach calls fn for every record in key order until fn returns false.
func (m *MemStore) ForEach(fn func(Record) bool) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errMemClosed
	}
	keys := m.sortedKeys()
	recs := make([]Record, len(keys))
	for i, k := range keys {
		recs[i] = m.recs[k]
	}
	m.mu.Unlock()
	for _, r := range recs {
		if !fn(r) {
			break
		}
	}
	return nil
}

// Close marks the store closed.
func (m *MemStore) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}

func (m *MemStore) sortedKeys() []Key {
	keys := make([]Key, 0, len(m.recs))
	for k := range m.recs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareKeys)
	return keys
}

// compareKeys orders keys as the store keys do (Name, NUL, Key).
func compareKeys(a, b Key) int {
	if a.Name != b.Name {
		if a.Name < b.Name {
			return -1
		}
		return 1
	}
	switch {
	case a.Key < b.Key:
		return -1
	case a.Key > b.Key:
		return 1
	}
	return 0
}
