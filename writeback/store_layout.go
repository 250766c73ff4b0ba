package writeback

// Regrouping a store's records by partition when it opens (layout 2,
// record.go): the layout file, the rewrite, and the durable file writes
// they need.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/cockroachdb/pebble"
)

// layoutName is the file in the data dir that says how the store's records
// are grouped (layoutLine); it is written once every record is.
const layoutName = "sluice-store-layout"

// layoutLine is layoutName's content for a store whose records are all of
// layout 2 in count partitions.
func layoutLine(count int) string { return fmt.Sprintf("layout 2, partitions %d\n", count) }

// relayoutBatch is how many records relayout moves per atomic batch.
const relayoutBatch = 1024

// relayout makes every record's key the layout-2 key of its partition
// (record.go), unless layoutName says they already are: records of layout
// 1, and those of another partition count, are rewritten, each in one
// batch with the deletion of its old key, so that a crash leaves every
// record under one key, and the next open goes on. Keys that do not parse
// cannot be loaded by any key, and are deleted, logged. layoutName is
// removed first and written last: a store whose file is there has no
// record of another partition count. Keys of layout 1 are looked for on
// every open (hasLayout1), since an earlier version run on the store
// meanwhile writes them and leaves the file alone. A failure is logged;
// the next open tries again.
func (s *pebbleStore) relayout() {
	file := filepath.Join(s.path, layoutName)
	want := layoutLine(s.parts.Count)
	if b, err := os.ReadFile(file); err == nil && string(b) == want && !s.hasLayout1() {
		return
	}
	start := time.Now()
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error("writeback: cannot remove the store's layout file; records not regrouped", "path", file, "err", err)
		return
	}
	if err := syncDir(s.path); err != nil {
		s.log.Error("writeback: cannot sync the store's directory; records not regrouped", "path", s.path, "err", err)
		return
	}
	moved, dropped := 0, 0
	b := s.db.NewBatch()
	var failed error
	commit := func() bool {
		if b.Count() == 0 {
			return true
		}
		s.writeMu.Lock()
		err := s.room(int64(b.Len()))
		if err == nil {
			err = b.Commit(pebble.Sync)
		}
		s.writeMu.Unlock()
		b.Close()
		b = s.db.NewBatch()
		if err != nil {
			failed = err
			return false
		}
		return true
	}
	var buf []byte
	err := s.scan(nil, nil, "regrouping skips the table", func(k, v []byte) bool {
		var key Key
		var perr error
		if part, rest, ok := splitPartKey(k); ok {
			if key, perr = parseStoreKey(rest); perr == nil && part == s.part(key) {
				return true
			}
		} else {
			key, perr = parseStoreKey(k)
		}
		if perr != nil {
			s.log.Warn("writeback: deleting a store record whose key does not parse", "path", s.path, "key", k, "err", perr)
			dropped++
		} else {
			buf = appendPartKey(buf[:0], s.part(key), key)
			_ = b.Set(buf, v, nil) // Set copies; it fails only on a committed batch
			moved++
		}
		_ = b.Delete(k, nil)
		if b.Count() >= 2*relayoutBatch {
			return commit()
		}
		return true
	})
	if err == nil && failed == nil {
		commit()
	}
	b.Close()
	if err == nil {
		err = failed
	}
	if err != nil {
		s.log.Error("writeback: regrouping the store's records failed; the records not reached are not found until the next open regroups them",
			"path", s.path, "partitions", s.parts.Count, "moved", moved, "err", err)
		return
	}
	if err := writeFileSync(file, want); err != nil {
		s.log.Error("writeback: cannot write the store's layout file; the next open reads the store again", "path", file, "err", err)
		return
	}
	if moved+dropped > 0 {
		s.log.Info("writeback: regrouped the store's records by partition",
			"path", s.path, "partitions", s.parts.Count, "moved", moved, "dropped", dropped, "took", time.Since(start))
	}
}

// hasLayout1 reports whether the store holds a key of layout 1 (one an
// earlier version wrote, also after this one): every such key sorts at or
// after "\x00\x01", every key of layout 2 before it.
func (s *pebbleStore) hasLayout1() bool {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{0, 1}})
	if err != nil {
		return true
	}
	found := it.First()
	if err := it.Close(); err != nil {
		return true
	}
	return found
}

// writeFileSync writes name durably: a temporary file, synced, renamed
// over name, and the directory synced.
func writeFileSync(name, content string) error {
	tmp := name + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err = f.WriteString(content); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(name))
}

// syncDir makes dir's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
