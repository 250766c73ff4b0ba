package writeback

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/bloom"
	"github.com/cockroachdb/pebble/vfs"
	"github.com/sluicehq/sluice/bucket"
)

// pebbleStore is the Store on a pebble LSM database.
type pebbleStore struct {
	db      *pebble.DB
	path    string
	log     *slog.Logger
	corrupt atomic.Uint64
	lock    *os.File // holds lockName's lock until Close
	// reserve is the free space kept beyond each batch and the tables
	// (DefaultStoreReserve); tests make it smaller.
	reserve int64
	// parts is how the records are grouped (layout 2, record.go).
	parts Partitioning

	// reported holds the corrupt tables (or, when pebble's error names
	// none, the error texts) already logged, so that a bad table read by
	// every miss is logged once, not once per check.
	reportMu sync.Mutex
	reported map[string]bool

	// writeMu orders Write and DeleteExpired so that an expiry pass never
	// deletes a record written after it read the expired one; it also
	// guards cursor.
	writeMu sync.Mutex
	cursor  []byte // where the next DeleteExpired starts; nil: the beginning
}

var _ Store = (*pebbleStore)(nil)

// openPebble opens the pebble store in dir with its records in one
// partition.
func openPebble(dir string, logger *slog.Logger) (*pebbleStore, error) {
	return openPebbleParts(dir, logger, Partitioning{})
}

// openPebbleParts opens the pebble store in dir with its records grouped
// by parts, rewriting those written with another grouping (relayout).
func openPebbleParts(dir string, logger *slog.Logger, parts Partitioning) (*pebbleStore, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if parts.Count <= 0 || parts.Of == nil {
		parts = Partitioning{Count: 1, Of: func(Key) int { return 0 }}
	}
	if parts.Count > maxPartitions {
		return nil, fmt.Errorf("writeback: open store %s: %d partitions, more than %d", dir, parts.Count, maxPartitions)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("writeback: open store %s: %w", dir, err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("writeback: open store %s: %w", dir, err)
	}
	db, err := openPebbleDB(dir, logger)
	if err != nil && unreadable(err) {
		// The files are there but cannot be read as a store: move them
		// aside (kept for a look) and start empty. The node's counts come
		// back from the other nodes, as after a crash that lost the disk.
		aside, qerr := moveAside(dir, time.Now())
		if qerr != nil {
			lock.Close()
			return nil, fmt.Errorf("writeback: open store %s: %w (moving its files aside failed too: %v)", dir, err, qerr)
		}
		logger.Error("writeback: store files unreadable; moved them aside and starting with an empty store",
			"path", dir, "moved_to", aside, "err", err)
		db, err = openPebbleDB(dir, logger)
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("writeback: open store %s: %w", dir, err)
	}
	s := &pebbleStore{db: db, path: dir, log: logger, lock: lock, reserve: DefaultStoreReserve, parts: parts}
	s.relayout()
	return s, nil
}

// part returns k's partition.
func (s *pebbleStore) part(k Key) uint32 { return uint32(s.parts.Of(k)) }

// lockName is the file in the data dir whose lock says a process has the
// store open; it is never moved aside.
const lockName = "sluice.lock"

// errDirInUse is returned when another store (in this process or another)
// has the data dir open.
var errDirInUse = errors.New("the data dir is in use by another sluice process (or store) on this machine")

// openPebbleDB opens the pebble database in dir; a panic in pebble (its
// Fatalf, on some corrupt files) comes back as an error.
func openPebbleDB(dir string, logger *slog.Logger) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			db, err = nil, fmt.Errorf("pebble failed opening the store: %v", r)
		}
	}()
	opts := pebbleOptions(logger.With("path", dir))
	defer opts.Cache.Unref() // the open database holds its own reference
	return pebble.Open(dir, opts)
}

// blockCacheSize is the store's block cache. Pebble charges its memtables
// (two of 4 MiB at most) to the block cache; its default of 8 MiB left no
// room for blocks, so every read went to the file and decompressed its
// block (7 µs for a key the store does not hold, BenchmarkStoreLoadAbsent).
// 32 MiB keeps the filters and index blocks of some 10 million records
// and the data blocks last read. The memory is taken only as blocks are
// read: an idle node with an empty store uses none of it.
const blockCacheSize = 32 << 20

// pebbleOptions are the store's options:
//   - FS is the plain operating-system file system: left nil, pebble wraps
//     it in a disk-health checker whose only output is its DiskSlow event,
//     which the store does not listen to (pebble's default listener drops
//     it), and whose tickers (one for the file system and one per file
//     being written, every 2 s) woke an idle node 1.5 times a second
//     (docs/performance.md, idle).
//   - A bloom filter of 10 bits a key in every table (1 % false positives)
//     answers the first check of a new key, which the store does not
//     hold, without reading the table's data blocks.
//   - The block cache holds blockCacheSize; the caller unrefs Cache once
//     the database is open.
func pebbleOptions(logger *slog.Logger) *pebble.Options {
	return &pebble.Options{
		Logger: pebbleLogger{logger},
		FS:     vfs.Default,
		Cache:  pebble.NewCache(blockCacheSize),
		Levels: []pebble.LevelOptions{{FilterPolicy: bloom.FilterPolicy(10)}},
	}
}

// unreadable reports whether an error opening the store comes from its
// files' contents, not from the machine: another process holding the store,
// permissions, a full or read-only disk, I/O errors and exhausted file
// descriptors are not cured by moving the files aside, and their data is
// still good.
func unreadable(err error) bool {
	for _, e := range []error{fs.ErrPermission, fs.ErrNotExist, syscall.EAGAIN, syscall.ENOSPC, syscall.EROFS,
		syscall.EIO, syscall.EMFILE, syscall.ENFILE, syscall.ENOTDIR} {
		if errors.Is(err, e) {
			return false
		}
	}
	return true
}

// asidePrefix starts the name of a directory inside the data dir holding
// the files of a store that could not be read.
const asidePrefix = "unreadable-"

// moveAside moves every entry of dir, except earlier moved-aside
// directories and the lock file, into a new directory dir/unreadable-<time>, and returns it.
func moveAside(dir string, now time.Time) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	aside := filepath.Join(dir, asidePrefix+now.UTC().Format("20060102T150405.000000000Z"))
	if err := os.Mkdir(aside, 0o755); err != nil {
		return "", err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), asidePrefix) {
			continue
		}
		if e.Name() == lockName {
			continue
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(aside, e.Name())); err != nil {
			return "", err
		}
	}
	return aside, nil
}

// Load implements Store.
func (s *pebbleStore) Load(k Key) (Record, bool, error) {
	var kb [256]byte
	v, closer, err := s.db.Get(appendPartKey(kb[:0], s.part(k), k))
	if errors.Is(err, pebble.ErrNotFound) && k.Limit != 0 {
		// A multi-limit counter written before the limit index was typed
		// (legacyStoreKey): its next flush writes it under its new key.
		// Its old key reads as a key of one limit, and relayout put it in
		// that key's partition.
		legacy := legacyStoreKey(nil, k)
		as := Key{Name: k.Name, Key: string(legacy[len(k.Name)+1:])}
		v, closer, err = s.db.Get(appendPartKey(kb[:0], s.part(as), as))
	}
	if errors.Is(err, pebble.ErrNotFound) {
		return Record{}, false, nil
	}
	if err != nil && pebble.IsCorruptionError(err) {
		// A bad block in a table: the records in it are lost. The key
		// starts fresh, and its next flush writes a newer record that
		// hides the lost one.
		s.corrupt.Add(1)
		s.reportTable(err, "skipping the key", "name", k.Name, "key", k.Key)
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
		buf = appendPartKey(buf[:0], s.part(r.Key), r.Key)
		n := len(buf)
		buf = appendRecordValue(buf, r.State, r.Version)
		if err := b.Set(buf[:n], buf[n:], nil); err != nil {
			return fmt.Errorf("writeback: store %s: write: %w", s.path, err)
		}
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.room(int64(b.Len())); err != nil {
		return fmt.Errorf("writeback: store %s: write %d records: %w", s.path, len(recs), err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("writeback: store %s: write %d records: %w", s.path, len(recs), err)
	}
	return nil
}

// CheckSpace returns the error a write would get for lack of disk space
// (wrapping ErrStoreFull), or nil when the disk has room for the reserve.
func (s *pebbleStore) CheckSpace() error {
	if err := s.room(0); err != nil {
		return fmt.Errorf("writeback: store %s: %w", s.path, err)
	}
	return nil
}

// room refuses a batch of n bytes (its write-ahead-log size) when the disk
// would be left with less than the reserve plus the tables' size: pebble
// panics when a write-ahead-log or MANIFEST write fails, so the store stops
// writing while pebble still has room for its flushes and compactions.
// When the free space cannot be read the write goes ahead.
func (s *pebbleStore) room(n int64) error {
	free, err := freeBytes(s.path)
	if err != nil {
		return nil
	}
	tables := int64(s.db.Metrics().Total().Size)
	if need := n + s.reserve + tables; free < need {
		return fmt.Errorf("%w: %d bytes free, %d needed (batch %d, reserve %d, tables %d)",
			ErrStoreFull, free, need, n, s.reserve, tables)
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
		if !pebble.IsCorruptionError(err) {
			return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
		}
		// The pass ran into a corrupt table: the next one starts after
		// it (or from the beginning when its keys are not known), and the
		// deletions found before it still go ahead.
		s.cursor = nil
		if next, ok := s.skipTable(err, "expiry pass skips the table"); ok {
			s.cursor = next
		}
	}
	if n == 0 {
		return 0, nil
	}
	if err := s.room(int64(b.Len())); err != nil {
		return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return 0, fmt.Errorf("writeback: store %s: expire: %w", s.path, err)
	}
	return n, nil
}

// ForEach implements Store. A table pebble finds corrupt is reported and
// the scan goes on after its last key (keys of good tables within its range
// are not visited then); when pebble's error does not say which table,
// the scan ends there, reported.
func (s *pebbleStore) ForEach(fn func(Record) bool) error {
	return s.scan(nil, nil, "scan skips the table", s.records(fn))
}

// ForEachIn implements PartitionScanner: it reads only the key ranges of
// the partitions asked for, as ForEach reads the whole store. One iterator
// serves every range (making one costs microseconds, as much as reading
// tens of records); a corrupt table in a range is stepped over as ForEach
// does, from the last record given.
func (s *pebbleStore) ForEachIn(parts []bool, fn func(Record) bool) error {
	more := true
	each := s.records(func(r Record) bool {
		more = fn(r)
		return more
	})
	var it *pebble.Iterator
	defer func() {
		if it != nil {
			it.Close()
		}
	}()
	var last []byte
	for p := 0; p < len(parts) && p < s.parts.Count; p++ {
		if !parts[p] {
			continue
		}
		end := p + 1 // a run of partitions is one key range
		for end < len(parts) && end < s.parts.Count && parts[end] {
			end++
		}
		lower := appendPartPrefix(nil, uint32(p))
		upper := appendPartPrefix(nil, uint32(end))
		p = end
		if it == nil {
			var err error
			if it, err = s.db.NewIter(nil); err != nil {
				return fmt.Errorf("writeback: store %s: scan: %w", s.path, err)
			}
		}
		last = last[:0]
		for valid := it.SeekGE(lower); valid && more && bytes.Compare(it.Key(), upper) < 0; valid = it.Next() {
			last = append(last[:0], it.Key()...)
			each(it.Key(), it.Value())
		}
		if !more {
			return nil
		}
		err := it.Error()
		if err == nil {
			continue
		}
		it.Close()
		it = nil
		if !pebble.IsCorruptionError(err) {
			return fmt.Errorf("writeback: store %s: scan: %w", s.path, err)
		}
		if len(last) > 0 {
			lower = append(last, 0) // the next key after the last given
		}
		if err := s.scan(lower, upper, "scan skips the table", each); err != nil || !more {
			return err
		}
	}
	return nil
}

// records decodes each stored record for fn, skipping (logged and counted)
// those that do not decode.
func (s *pebbleStore) records(fn func(Record) bool) func(k, v []byte) bool {
	return func(k, v []byte) bool {
		rec, err := decodeRecord(k, v)
		if err != nil {
			var key Key
			if _, rest, ok := splitPartKey(k); ok {
				key, _ = parseStoreKey(rest)
			}
			s.skipCorrupt(key, err)
			return true
		}
		return fn(rec)
	}
}

// scan calls fn with every stored key and value in [lower, upper) (nil:
// unbounded) in key order until fn returns false. A corrupt table is
// reported (action) and stepped over, as ForEach says.
func (s *pebbleStore) scan(lower, upper []byte, action string, fn func(k, v []byte) bool) error {
	for {
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
		if err != nil {
			return fmt.Errorf("writeback: store %s: scan: %w", s.path, err)
		}
		stopped := false
		for valid := it.First(); valid; valid = it.Next() {
			if !fn(it.Key(), it.Value()) {
				stopped = true
				break
			}
		}
		switch err = it.Close(); {
		case err == nil:
			return nil
		case !pebble.IsCorruptionError(err):
			return fmt.Errorf("writeback: store %s: scan: %w", s.path, err)
		case stopped:
			return nil // fn asked for no more
		}
		next, ok := s.skipTable(err, action)
		if !ok || bytes.Compare(next, lower) <= 0 {
			s.log.Error("writeback: scan of the store ended at a corrupt table; later records not visited",
				"path", s.path, "err", err.Error())
			return nil
		}
		if upper != nil && bytes.Compare(next, upper) >= 0 {
			return nil
		}
		lower = next
	}
}

// tableNum finds the table number in pebble's corruption errors
// ("pebble/table: invalid table 000012 (checksum mismatch …)").
var tableNum = regexp.MustCompile(`table (\d+)`)

// corruptTable returns the number and file path of the table a corruption
// error names.
func (s *pebbleStore) corruptTable(err error) (uint64, string, bool) {
	m := tableNum.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, "", false
	}
	num, perr := strconv.ParseUint(m[1], 10, 64)
	if perr != nil {
		return 0, "", false
	}
	return num, filepath.Join(s.path, fmt.Sprintf("%06d.sst", num)), true
}

// reportTable logs a corruption error once per table (or error text),
// naming the store and the table's file, and what the store does about it.
func (s *pebbleStore) reportTable(err error, action string, args ...any) {
	id := err.Error()
	file := ""
	if _, f, ok := s.corruptTable(err); ok {
		id, file = f, f
	}
	s.reportMu.Lock()
	seen := s.reported[id]
	if !seen && len(s.reported) < 1024 {
		if s.reported == nil {
			s.reported = map[string]bool{}
		}
		s.reported[id] = true
	}
	s.reportMu.Unlock()
	if seen {
		return
	}
	s.log.Error("writeback: corrupt store table; its records are lost, "+action,
		// err.Error(): pebble's errors print a multi-line report with %+v,
		// which is how slog's text handler formats an error value.
		append([]any{"path", s.path, "file", file, "err", err.Error()}, args...)...)
}

// skipTable reports the corrupt table err names and returns the first
// store key after the table's key range; false when the table or its range
// is not known.
func (s *pebbleStore) skipTable(err error, action string) ([]byte, bool) {
	s.corrupt.Add(1)
	s.reportTable(err, action)
	num, _, ok := s.corruptTable(err)
	if !ok {
		return nil, false
	}
	levels, lerr := s.db.SSTables()
	if lerr != nil {
		return nil, false
	}
	for _, level := range levels {
		for _, tbl := range level {
			if uint64(tbl.FileNum) == num {
				// The smallest key above every key of the table.
				return append(slices.Clone(tbl.Largest.UserKey), 0), true
			}
		}
	}
	return nil, false
}

// Close implements Store.
func (s *pebbleStore) Close() error {
	err := s.db.Close()
	s.lock.Close() // releases the lock
	if err != nil {
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
