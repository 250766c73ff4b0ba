//go:build !unix

package writeback

import (
	"os"
	"path/filepath"
)

// lockDir opens dir/lockName; without flock it cannot tell whether another
// process uses dir, and pebble's own lock is the only guard.
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
}
