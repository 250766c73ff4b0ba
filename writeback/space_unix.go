//go:build unix

package writeback

import "syscall"

// freeBytes returns the bytes an unprivileged process may still write on
// the filesystem holding dir.
func freeBytes(dir string) (int64, error) {
	var s syscall.Statfs_t
	if err := syscall.Statfs(dir, &s); err != nil {
		return 0, err
	}
	return int64(s.Bavail) * int64(s.Bsize), nil
}
