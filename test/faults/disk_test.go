//go:build faults && linux

package faults

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Disk faults: a host's data dir on a small filesystem of its own, which
// the test fills and frees, and a slow store (cgroup v1 blkio throttling
// of the loop device under a host's data dir).
//
// This kernel has no device-mapper (`dmsetup targets` cannot reach the
// driver), so there is no `delay` target; blkio's throttle is what works
// here: a limit of r I/Os a second per direction on the loop device, for
// the node's process only, makes a run of n synchronous writes take at
// least (n−1)/r (blk-throttle lets the first I/O of a time slice pass at
// once and dispatches the rest at the rate). Writes that only reach the
// page cache are not throttled (cgroup v1 does not follow writeback); a
// store that fsyncs its batches (pebble's WAL) waits for its writes.

// disk is a host's own filesystem under its data dir.
type disk struct {
	mount  string // mount point; the data dir is mount/data
	loop   string // /dev/loopN, "" for a tmpfs
	filler string // the file FillDisk grows, on the same filesystem
	cgroup string // blkio cgroup of SlowStore, "" when none
}

// TmpfsDisk puts h's data dir on a tmpfs of sizeBytes of its own (before
// Start). The cleanup unmounts it after the process is gone.
func (h *Host) TmpfsDisk(sizeBytes int64) {
	t := h.c.t
	t.Helper()
	h.mustNotRun("TmpfsDisk")
	dir := t.TempDir()
	if out, err := runErr(nil, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", sizeBytes), "tmpfs", dir); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { unmount(h, dir) })
	h.useDisk(&disk{mount: dir})
}

// LoopDisk puts h's data dir on an ext4 filesystem of sizeBytes on a loop
// device of its own, backed by a file in the test's temporary directory
// (before Start). It skips the test where loop devices or mkfs.ext4 are
// missing. The cleanup unmounts it and detaches the device after the
// process is gone.
func (h *Host) LoopDisk(sizeBytes int64) {
	t := h.c.t
	t.Helper()
	h.mustNotRun("LoopDisk")
	for _, tool := range []string{"losetup", "mkfs.ext4", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("a loop disk needs %s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(sizeBytes)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, err := runErr(nil, "losetup", "--find", "--show", img)
	if err != nil {
		t.Skipf("no loop device here: losetup: %v: %s", err, out)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := runErr(nil, "losetup", "-d", loop); err != nil {
			t.Errorf("losetup -d %s: %v %s", loop, err, out)
		}
	})
	// No reserved blocks (the node runs as root and would use them, while
	// statfs's Bavail leaves them out) and no lazy initialisation (no
	// kernel thread writing to the device later).
	run(t, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", loop)
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", loop, mnt)
	t.Cleanup(func() { unmount(h, mnt) })
	h.useDisk(&disk{mount: mnt, loop: loop})
}

func (h *Host) mustNotRun(what string) {
	h.mu.Lock()
	started := h.cmd != nil
	h.mu.Unlock()
	if started {
		h.c.t.Fatalf("%s on %s: call it before Start", what, h.Name)
	}
}

func (h *Host) useDisk(d *disk) {
	d.filler = filepath.Join(d.mount, "filler")
	h.disk = d
	h.DataDir = filepath.Join(d.mount, "data")
}

// unmount unmounts dir, lazily when it is busy (reported as an error).
func unmount(h *Host, dir string) {
	if out, err := runErr(nil, "umount", dir); err != nil {
		h.c.t.Errorf("umount %s: %v: %s", dir, err, out)
		runErr(nil, "umount", "-l", dir)
	}
}

func (h *Host) needDisk(what string) *disk {
	h.c.t.Helper()
	if h.disk == nil {
		h.c.t.Fatalf("%s on %s: its data dir has no filesystem of its own (TmpfsDisk, LoopDisk)", what, h.Name)
	}
	return h.disk
}

// FreeBytes is what statfs says an unprivileged writer may still use on
// h's data dir's filesystem (Bavail, which the store checks too).
func (h *Host) FreeBytes() int64 {
	d := h.needDisk("FreeBytes")
	var s unix.Statfs_t
	if err := unix.Statfs(d.mount, &s); err != nil {
		h.c.t.Fatal(err)
	}
	return int64(s.Bavail) * int64(s.Bsize)
}

// FillDisk grows a filler file beside h's data dir (allocated blocks,
// fallocate) until the filesystem has no room left for it, and returns the
// free bytes left: 0 on a tmpfs, less than fillStep on ext4 (whose extent
// blocks make the last request fall short).
func (h *Host) FillDisk() int64 {
	t := h.c.t
	t.Helper()
	d := h.needDisk("FillDisk")
	f, err := os.OpenFile(d.filler, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The node writes meanwhile, so free space is read again each round;
	// bounded: a disk of gigabytes fills in a few hundred rounds.
	for range 4096 {
		free := h.FreeBytes()
		n := free
		if n < fillStep {
			n = fillStep
		}
		fi, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		err = unix.Fallocate(int(f.Fd()), 0, fi.Size(), n)
		switch {
		case err == nil:
		case errors.Is(err, syscall.ENOSPC) && free < fillStep:
			return h.FreeBytes()
		case errors.Is(err, syscall.ENOSPC):
			// Too much at once (metadata): take it in steps.
			if err := unix.Fallocate(int(f.Fd()), 0, fi.Size(), fillStep); err != nil && !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fallocate in %s: %v", d.filler, err)
			}
		default:
			t.Fatalf("fallocate %d bytes in %s: %v", n, d.filler, err)
		}
	}
	t.Fatalf("%s: the disk did not fill (free %d bytes)", h.Name, h.FreeBytes())
	return 0
}

// fillStep is FillDisk's smallest request.
const fillStep = 64 << 10

// FreeDisk removes FillDisk's filler and returns the free bytes then.
func (h *Host) FreeDisk() int64 {
	t := h.c.t
	t.Helper()
	d := h.needDisk("FreeDisk")
	if err := os.Remove(d.filler); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return h.FreeBytes()
}

// blkioRoot is cgroup v1's blkio hierarchy.
const blkioRoot = "/sys/fs/cgroup/blkio"

// SlowStore makes every read and write of h's process on its loop disk
// wait for its turn at iops = 1 s / perIO in each direction (cgroup v1
// blkio throttling of the loop device), and returns the cgroup's
// directory. The process must be running; a restarted process is not in
// it (call SlowStore again). FastStore or the test's cleanup undoes it. It
// skips the test where blkio throttling is missing.
func (h *Host) SlowStore(perIO time.Duration) string {
	t := h.c.t
	t.Helper()
	d := h.needDisk("SlowStore")
	if d.loop == "" {
		t.Fatalf("SlowStore on %s: its data dir is not on a block device (LoopDisk)", h.Name)
	}
	if _, err := os.Stat(filepath.Join(blkioRoot, "blkio.throttle.write_iops_device")); err != nil {
		t.Skipf("no cgroup v1 blkio throttling here: %v", err)
	}
	iops := int(time.Second / perIO)
	if iops < 1 || perIO <= 0 {
		t.Fatalf("SlowStore: %v per I/O is not between 1 ns and 1 s", perIO)
	}
	var st unix.Stat_t
	if err := unix.Stat(d.loop, &st); err != nil {
		t.Fatal(err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
	if d.cgroup == "" {
		cg := filepath.Join(blkioRoot, "sluice-"+h.c.id+"-"+h.Name)
		if err := os.Mkdir(cg, 0o755); err != nil {
			t.Fatalf("blkio cgroup: %v", err)
		}
		d.cgroup = cg
		t.Cleanup(func() { h.FastStore() })
	}
	for _, f := range []string{"blkio.throttle.read_iops_device", "blkio.throttle.write_iops_device"} {
		writeFile(h, filepath.Join(d.cgroup, f), fmt.Sprintf("%s %d", dev, iops))
	}
	writeFile(h, filepath.Join(d.cgroup, "cgroup.procs"), strconv.Itoa(h.PID()))
	return d.cgroup
}

// FastStore moves h's process back to the root blkio cgroup and removes
// SlowStore's cgroup, if any.
func (h *Host) FastStore() {
	t := h.c.t
	d := h.disk
	if d == nil || d.cgroup == "" {
		return
	}
	// Whatever is in the cgroup (the node, a probe) goes back to the root:
	// a cgroup with members cannot be removed.
	b, _ := os.ReadFile(filepath.Join(d.cgroup, "cgroup.procs"))
	for _, pid := range strings.Fields(string(b)) {
		if err := os.WriteFile(filepath.Join(blkioRoot, "cgroup.procs"), []byte(pid), 0); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Errorf("moving pid %s out of %s: %v", pid, d.cgroup, err)
		}
	}
	if err := os.Remove(d.cgroup); err != nil {
		t.Errorf("removing the cgroup %s: %v", d.cgroup, err)
		return
	}
	d.cgroup = ""
}

func writeFile(h *Host, path, s string) {
	h.c.t.Helper()
	if err := os.WriteFile(path, []byte(s), 0); err != nil {
		h.c.t.Fatalf("write %q to %s: %v", s, path, err)
	}
}

// syncWrites writes n blocks of 4 KiB to a new file in dir, each followed
// by fdatasync, from a process put in cgroup (when not "") before its
// first write, and returns how long the writes took.
func syncWrites(dir, cgroup string, n int) (time.Duration, error) {
	script := fmt.Sprintf("exec dd if=/dev/zero of=%s/probe bs=4k count=%d oflag=dsync status=none", dir, n)
	if cgroup != "" {
		script = fmt.Sprintf("echo $$ > %s/cgroup.procs && %s", cgroup, script)
	}
	start := time.Now()
	out, err := runErr(nil, "sh", "-c", script)
	took := time.Since(start)
	os.Remove(filepath.Join(dir, "probe"))
	if err != nil {
		return took, fmt.Errorf("%v: %s", err, out)
	}
	return took, nil
}
