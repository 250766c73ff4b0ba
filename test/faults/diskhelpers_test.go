//go:build faults && linux

package faults

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDiskHelpers checks that the disk helpers do what they say on two
// hosts: n0's data dir on a tmpfs, n1's on a loop device. FillDisk leaves
// no room for a 1 MiB file, FreeDisk gives it back; SlowStore puts n1's
// process in a throttled blkio cgroup, where n synchronous 4 KiB writes
// take at least (n−1) × the delay, and FastStore takes it out again and
// removes the cgroup.
func TestDiskHelpers(t *testing.T) {
	const size = 64 << 20
	c := New(t, 2)
	tm, lo := c.Hosts[0], c.Hosts[1]
	tm.TmpfsDisk(size)
	lo.LoopDisk(size)
	c.StartAll()

	for _, h := range c.Hosts {
		before := h.FreeBytes()
		left := h.FillDisk()
		t.Logf("%s (%s): %d bytes free, %d after FillDisk", h.Name, map[bool]string{true: "loop ext4", false: "tmpfs"}[h.disk.loop != ""], before, left)
		if left >= fillStep {
			t.Errorf("%s: %d bytes free after FillDisk, want fewer than %d", h.Name, left, fillStep)
		}
		if err := write1MiB(h.disk.mount); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("%s: writing 1 MiB on a full disk: %v, want ENOSPC", h.Name, err)
		}
		after := h.FreeDisk()
		t.Logf("%s: %d bytes free after FreeDisk", h.Name, after)
		if err := write1MiB(h.disk.mount); err != nil {
			t.Errorf("%s: writing 1 MiB after FreeDisk: %v", h.Name, err)
		}
		if h.Exited() {
			t.Fatalf("%s exited while its disk was full", h.Name)
		}
	}

	// Slow store: n synchronous writes at iops = 1/delay take at least
	// (n−1) × delay (the first of a slice passes at once).
	const delay, n = 100 * time.Millisecond, 10
	fast, err := syncWrites(lo.disk.mount, "", n)
	if err != nil {
		t.Fatal(err)
	}
	cg := lo.SlowStore(delay)
	if !slices.Contains(pidsIn(t, cg), lo.PID()) {
		t.Fatalf("%s (pid %d) is not in %s", lo.Name, lo.PID(), cg)
	}
	slow, err := syncWrites(lo.disk.mount, cg, n)
	if err != nil {
		t.Fatal(err)
	}
	least := (n - 1) * delay
	t.Logf("%d writes of 4 KiB with fdatasync on %s's loop disk: %v outside the cgroup, %v inside it (%v per I/O: no sooner than %v)",
		n, lo.Name, fast.Round(time.Millisecond), slow.Round(time.Millisecond), delay, least)
	if slow < least {
		t.Errorf("throttled writes took %v, less than %v", slow, least)
	}
	lo.FastStore()
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("FastStore left %s: %v", cg, err)
	}
	if !slices.Contains(pidsIn(t, blkioRoot), lo.PID()) {
		t.Errorf("%s is not back in the root blkio cgroup", lo.Name)
	}
	if lo.Exited() {
		t.Fatalf("%s exited", lo.Name)
	}
}

func write1MiB(dir string) error {
	p := filepath.Join(dir, "probe-1m")
	defer os.Remove(p)
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		return err
	}
	return f.Sync()
}

func pidsIn(t *testing.T, cgroup string) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}
