//go:build unix

package writeback

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// lockDir takes an exclusive lock on dir/lockName, held until the returned
// file is closed. Another holder, in this process or another, makes it
// fail with errDirInUse.
//
// A lock just released can still be held for a moment: a child this
// process forks (any os/exec) shares the lock's file until it execs, and
// closes its copy only then. So a refusal is tried again for lockRetry
// before it is reported; a real second holder fails after that wait.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(lockRetry)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", lockName, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, errDirInUse
		}
		time.Sleep(10 * time.Millisecond) // retry interval, not synchronisation
	}
}

// lockRetry is how long lockDir tries again a lock another holder has.
const lockRetry = 500 * time.Millisecond
