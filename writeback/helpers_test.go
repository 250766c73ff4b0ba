package writeback

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/test/testsupport"
)

// base is a realistic now: 2023-11-14 in Unix nanoseconds.
const base = int64(1_700_000_000_000_000_000)

// lim10 is 10 hits per minute.
var lim10 = bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: 10, WindowMS: 60_000}

// hashKey is FNV-1a over name, NUL, key, then mixed, as a caller would hash.
func hashKey(k Key) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(k.Name); i++ {
		h = (h ^ uint64(k.Name[i])) * 1099511628211
	}
	h *= 1099511628211
	for i := 0; i < len(k.Key); i++ {
		h = (h ^ uint64(k.Key[i])) * 1099511628211
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// logBuf is testsupport.LogBuffer: a process's or a logger's output, safe
// to read while it is written.
type logBuf = testsupport.LogBuffer

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

func openTestStore(t testing.TB, dir string) Store {
	t.Helper()
	st, err := OpenStore(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// newTestCache returns a cache over a fresh store in a temp dir, closed at
// cleanup unless the test closed it.
func newTestCache(t testing.TB, cfg Config) (*Cache, string) {
	t.Helper()
	dir := t.TempDir()
	return newCacheAt(t, cfg, dir), dir
}

func newCacheAt(t testing.TB, cfg Config, dir string) *Cache {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	c, err := New(cfg, openTestStore(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(context.Background()); err != nil && !errors.Is(err, ErrClosed) {
			t.Error(err)
		}
	})
	return c
}

func decide(t testing.TB, c *Cache, k Key, lim bucket.Limit, hits, now int64) bucket.Decision {
	t.Helper()
	d, err := c.Decide(hashKey(k), k, lim, hits, now)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// hookStore wraps a Store: failWrites makes the next writes fail, onWrite
// runs inside Write before the batch is written.
type hookStore struct {
	Store
	mu         sync.Mutex
	failWrites int
	onWrite    func([]Record)
	writes     [][]Record
}

var errInjected = errors.New("injected write failure")

func (h *hookStore) Write(recs []Record) error {
	h.mu.Lock()
	fail := h.failWrites > 0
	if fail {
		h.failWrites--
	}
	hook := h.onWrite
	h.writes = append(h.writes, append([]Record(nil), recs...))
	h.mu.Unlock()
	if hook != nil {
		hook(recs)
	}
	if fail {
		return errInjected
	}
	return h.Store.Write(recs)
}

// nopStore holds nothing: every Load misses, every Write succeeds.
type nopStore struct{}

func (nopStore) Load(Key) (Record, bool, error)        { return Record{}, false, nil }
func (nopStore) Write([]Record) error                  { return nil }
func (nopStore) DeleteExpired(int64, int) (int, error) { return 0, nil }
func (nopStore) ForEach(func(Record) bool) error       { return nil }
func (nopStore) Close() error                          { return nil }

// memStore is an in-memory Store for loop tests.
type memStore struct {
	mu   sync.Mutex
	recs map[Key]Record
}

func newMemStore() *memStore { return &memStore{recs: map[Key]Record{}} }

func (m *memStore) Load(k Key) (Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[k]
	return r, ok, nil
}

func (m *memStore) Write(recs []Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		m.recs[r.Key] = r
	}
	return nil
}

func (m *memStore) DeleteExpired(now int64, max int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, r := range m.recs {
		if n == max {
			break
		}
		if r.State.Fresh(now) {
			delete(m.recs, k)
			n++
		}
	}
	return n, nil
}

func (m *memStore) ForEach(fn func(Record) bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.recs {
		if !fn(r) {
			break
		}
	}
	return nil
}

func (m *memStore) Close() error { return nil }
