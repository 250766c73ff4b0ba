package writeback

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble"
	"github.com/sluicehq/sluice/bucket"
)

// pebbleStore is the Store on a pebble LSM database.
type pebbleStore struct {
	db      *pebble.DB
	path    string
	log     *slog.Logger
	corrupt atomic.Uint64

	// writeMu orders Write and DeleteExpired so that an expiry pass never
	// deletes a record written after it read the expired one; it also
	// guards cursor.
	writeMu sync.Mutex
	cursor  []byte // where the next DeleteExpired starts; nil: the beginning
}

var _ Store = (*pebbleStore)(nil)

// openPebble opens the pebble store in dir.
func openPebble(dir string, logger *slog.Logger) (*pebbleStore, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("writeback: open store %s: %w", dir, err)
	}
	opts := &pebble.Options{Logger: pebbleLogger{logger.With("path", dir)}}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("writeback: open store %s: %w", dir, err)
	}
	return &pebbleStore{db: db, path: dir, log: logger}, nil
}

// Load implements Store.
func (s *pebbleStore) Load(k Key) (Record, bool, error) {
	var kb [256]byte
	v, closer, err := s.db.Get(appendStoreKey(kb[:0], k))
	if errors.Is(err, pebble.ErrNotFound) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("writeback: store %s: load %q/%q: %w", s.path, k.Name, k.Key, err)
	}
	st, ver, derr := decodeRecordValue(v)
	closer.Close()
	if derr != nil {
		s.skipCorrupt(k, derr)
		return Record{}, false, nil
	}
	return Record{Key: k, State: st, Version: ver}, true, nil
}

// skipCorrupt logs and counts a corrupt record.
func (s *pebbleStore) skipCorrupt(k Key, err error) {
	s.corrupt.Add(1)
	s.log.Warn("writeback: skipping corrupt store record", "path", s.path, "name", k.Name, "key", k.Key, "err", err)
}

// CorruptRecords returns how many corrupt records Load and ForEach skipped.
func (s *pebbleStore) CorruptRecords() uint64 { return s.corrupt.Load() }

// Write implements Store.
func (s *pebbleStore) Write(recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	b := s.db.NewBatchWithSize(len(recs) * (recordOverhead + bucket.EncodedSize + 48))
	defer b.Close()
	buf := make([]byte, 0, 256)
	for i := range recs {
		r := &recs[i]
		buf = appendStoreKey(buf[:0], r.Key)
		n := len(buf)
		buf = appendRecordValue(buf, r.State, r.Version)
		if err := b.Set(buf[:n], buf[n:], nil); err != nil {
			return fmt.Errorf("writeback: store %s: write: %w", s.path, err)
		}
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("writeback: store %s: write %d records: %w", s.path, len(recs), err)
	}
	return nil
}

// DeleteExpired implements Store.
func (s *pebbleStore) DeleteExpired(now int64, max int) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	it, err := s.db.NewIter(nil)
	if err != nil {
		return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
	}
	b := s.db.NewBatch()
	defer b.Close()
	n, seen := 0, 0
	valid := it.SeekGE(s.cursor)
	for ; valid && seen < max; valid = it.Next() {
		seen++
		st, _, derr := decodeRecordValue(it.Value())
		if derr != nil {
			s.log.Warn("writeback: deleting corrupt store record", "path", s.path, "key", it.Key(), "err", derr)
		} else if !st.Fresh(now) {
			continue
		}
		if err := b.Delete(it.Key(), nil); err != nil {
			it.Close()
			return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
		}
		n++
	}
	if valid {
		s.cursor = append(s.cursor[:0], it.Key()...)
	} else {
		s.cursor = nil
	}
	if err := it.Close(); err != nil {
		return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
	}
	if n == 0 {
		return 0, nil
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
	}
	return n, nil
}

// ForEach implements Store.
func (s *pebbleStore) ForEach(fn func(Record) bool) error {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return fmt.Errorf("writeback: store %s: scan: %w", s.path, err)
	}
	for valid := it.First(); valid; valid = it.Next() {
		rec, derr := decodeRecord(it.Key(), it.Value())
		if derr != nil {
			k, _ := parseStoreKey(it.Key())
			s.skipCorrupt(k, derr)
			continue
		}
		if !fn(rec) {
			break
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("writeback: store %s: scan: %w", s.path, err)
	}
	return nil
}

// Close implements Store.
func (s *pebbleStore) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("writeback: store %s: close: %w", s.path, err)
	}
	return nil
}

// pebbleLogger sends pebble's log lines to slog. Fatalf panics instead of
// exiting the process.
type pebbleLogger struct{ log *slog.Logger }

func (l pebbleLogger) Infof(format string, args ...any) {
	l.log.Info("pebble: " + fmt.Sprintf(format, args...))
}

func (l pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.log.Error("pebble: " + msg)
	panic("pebble: " + msg)
}
