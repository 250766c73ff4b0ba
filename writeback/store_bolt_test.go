package writeback

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// boltStore is a Store on bbolt, kept only to rerun the engine comparison
// of docs/store.md (BenchmarkStoreFlush, BenchmarkStoreInsert,
// BenchmarkStoreLoad): it lives in a test file, so the binary carries pebble
// alone. Same record format as the pebble store; fsync on every commit, with
// the fast freelist settings that keep commits durable.
type boltStore struct {
	db     *bolt.DB
	path   string
	log    *slog.Logger
	cursor []byte // where the next DeleteExpired starts; nil: the beginning
}

var _ Store = (*boltStore)(nil)

var boltBucket = []byte("counters")

func openBolt(dir string, logger *slog.Logger) (*boltStore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "counters.bolt")
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return nil, fmt.Errorf("writeback: open bolt store %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("writeback: bolt store %s: %w", path, err)
	}
	return &boltStore{db: db, path: path, log: logger}, nil
}

func (s *boltStore) Load(k Key) (rec Record, ok bool, err error) {
	var kb [256]byte
	err = s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(boltBucket).Get(appendPartKey(kb[:0], 0, k))
		if v == nil {
			return nil
		}
		st, ver, derr := decodeRecordValue(v)
		if derr != nil {
			s.log.Warn("writeback: skipping corrupt store record", "path", s.path, "name", k.Name, "key", k.Key, "err", derr)
			return nil
		}
		rec, ok = Record{Key: k, State: st, Version: ver}, true
		return nil
	})
	return rec, ok, err
}

func (s *boltStore) Write(recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	// Puts in key order: bbolt inserts into a node's sorted slice, so
	// unsorted keys into a large node cost a move each (seconds for 100k).
	type kv struct{ k, v []byte }
	kvs := make([]kv, len(recs))
	for i := range recs {
		r := &recs[i]
		kvs[i] = kv{appendPartKey(nil, 0, r.Key), appendRecordValue(nil, r.State, r.Version)}
	}
	slices.SortFunc(kvs, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		for _, e := range kvs {
			if err := b.Put(e.k, e.v); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *boltStore) DeleteExpired(now int64, max int) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(boltBucket).Cursor()
		k, v := c.First()
		if s.cursor != nil {
			k, v = c.Seek(s.cursor)
		}
		for seen := 0; k != nil && seen < max; seen++ {
			st, _, derr := decodeRecordValue(v)
			if derr != nil || st.Fresh(now) { // corrupt, or expired: it would start fresh
				if err := c.Delete(); err != nil {
					return err
				}
				n++
				k, v = c.Seek(k) // Delete moves the cursor; the next key is at or after k
				continue
			}
			k, v = c.Next()
		}
		s.cursor = nil
		if k != nil {
			s.cursor = append([]byte(nil), k...)
		}
		return nil
	})
	return n, err
}

func (s *boltStore) ForEach(fn func(Record) bool) error {
	return s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(boltBucket).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			rec, err := decodeRecord(k, v)
			if err != nil {
				continue
			}
			if !fn(rec) {
				break
			}
		}
		return nil
	})
}

func (s *boltStore) Close() error { return s.db.Close() }
