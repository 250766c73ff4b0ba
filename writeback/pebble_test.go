package writeback

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble"
)

// putRaw writes value under the raw store key, bypassing the encoder.
func putRaw(st Store, key, value []byte) error {
	return st.(*pebbleStore).db.Set(key, value, pebble.Sync)
}

// corruptStoreFiles overwrites the store's manifest with garbage.
func corruptStoreFiles(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifest in %s: %v", dir, err)
	}
	for _, f := range files {
		if err := os.WriteFile(f, []byte("this is not a pebble manifest"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
