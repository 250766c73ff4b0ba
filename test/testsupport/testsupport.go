// Package testsupport holds the helpers that tests of several packages
// share: building the sluice binary once per test process, and a small
// tmpfs for full-disk tests. It is imported by tests only.
package testsupport

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// SluiceBinary builds cmd/sluice once per test process, into a new
// directory under the temp dir named prefix…, and returns its path. Call
// RemoveBinary from the package's TestMain after the tests.
func SluiceBinary(t testing.TB, prefix string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", prefix)
		if err != nil {
			buildErr = err
			return
		}
		binDir, binPath = dir, filepath.Join(dir, "sluice")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// RemoveBinary removes what SluiceBinary built, if it built anything.
func RemoveBinary() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}

// MountTmpfs mounts a tmpfs of size (mount's syntax, "48m") on a new temp
// dir and unmounts it at cleanup, also when the test fails; register it
// before starting a process that uses it, so that the process is stopped
// first. It skips the test where mounting is not possible (not root, no
// tmpfs).
func MountTmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}

// LogBuffer collects output written from several goroutines (a process's
// stderr, a logger) and is safe to read while it is written.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
