package test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/test/testsupport"
)

// mountTmpfs is testsupport.MountTmpfs.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	return testsupport.MountTmpfs(t, size)
}

// freeBytes returns the free bytes of the filesystem holding dir.
func freeBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var s syscall.Statfs_t
	if err := syscall.Statfs(dir, &s); err != nil {
		t.Fatal(err)
	}
	return int64(s.Bavail) * int64(s.Bsize)
}

// readyz returns /readyz's status and body; status 0 when it does not
// answer.
func readyz(t *testing.T, p *proc) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.http + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// checkKeys sends one check per key (hits each, limit 10 in a long window)
// in one call and fails the test unless every answer has remaining.
func checkKeys(t *testing.T, c *client.Node, keys []string, hits, remaining int64) {
	t.Helper()
	req := &sluicev1.CheckRequest{}
	for _, k := range keys {
		req.Requests = append(req.Requests, &sluicev1.RateLimitRequest{Name: "disk", Key: k, Hits: proto.Int64(hits), Limit: 10, WindowMs: longWindow})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, req)
	if err != nil {
		t.Fatalf("check %d keys: %v", len(keys), err)
	}
	for i, r := range resp.Responses {
		if r.Error != "" || r.Status != sluicev1.Status_STATUS_UNDER_LIMIT || r.Remaining != remaining {
			t.Fatalf("%s: %v, want allowed with %d remaining", keys[i], r, remaining)
		}
	}
}

// keyRange returns n keys of about 200 bytes that do not compress (so that
// some ten thousand fill a disk of a few MiB).
func keyRange(prefix string, from, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		h := sha256.Sum256(fmt.Appendf(nil, "%s:%d", prefix, from+i))
		ks[i] = fmt.Sprintf("%s:%d:%x%x%x", prefix, from+i, h, h[:16], h[16:])
	}
	return ks
}

// grow makes the file at path (created if need be) n bytes longer, in
// allocated blocks.
func grow(t *testing.T, path string, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if n > 0 {
		if err := syscall.Fallocate(int(f.Fd()), 0, fi.Size(), n); err != nil {
			t.Fatalf("fallocate %d bytes in %s: %v", n, path, err)
		}
	}
}

// TestFullDiskKeepsNodeServing: a node whose data dir fills up (a small
// tmpfs, most of it taken by a filler file) keeps running and deciding
// every check exactly from memory, reports the full store (metrics,
// /readyz, one log line, not one per flush), catches up when the filler is
// removed, and has every count after a graceful stop and a restart.
// Before the fix the node died: pebble panicked on ENOSPC.
// Long on purpose: one story (fill the disk, keep deciding, free it, restart).
func TestFullDiskKeepsNodeServing(t *testing.T) {
	t.Parallel()
	// The store refuses a batch while free space < batch + reserve (16 MiB)
	// + its tables. Catching up after the disk frees writes the whole
	// backlog at once: the WAL, the tables and the compactions' copies not
	// yet deleted held up to 28 MiB under two CPU hogs, so a disk under
	// reserve + 2 × 28 MiB stays "full" for the store after the filler is
	// gone, until compactions end. 96 MiB leaves room for every later flush.
	dir := mountTmpfs(t, "96m")
	p := newProc(t, 0, "127.0.0.70")
	p.dataDir = filepath.Join(dir, "data")
	p.extra = []string{"--flush-interval", "200ms", "--log-level", "info"}
	p.start(t)
	c := dial(t, p.grpc)
	waitFor(t, 30*time.Second, "the node is ready", func() bool {
		code, _ := readyz(t, p)
		return code == 200
	})
	if w := metric(t, p, "sluice_store_writable"); w != 1 {
		t.Fatalf("sluice_store_writable %v on an empty disk", w)
	}

	// Leave the store 6 MiB above its 16 MiB reserve.
	filler := filepath.Join(dir, "filler")
	grow(t, filler, freeBytes(t, dir)-22<<20)

	hot := keyRange("hot", 0, 10)
	checkKeys(t, c, hot, 3, 7)
	// New keys until the store refuses a flush (bounded: 400k keys, 2 min).
	n, deadline := 0, time.Now().Add(2*time.Minute)
	for metric(t, p, "sluice_store_writable") == 1 {
		if n >= 400_000 || time.Now().After(deadline) {
			t.Fatalf("%d keys pushed, the store never reported full (free %d bytes)", n, freeBytes(t, dir))
		}
		for range 10 {
			checkKeys(t, c, keyRange("k", n, 1000), 1, 9)
			n += 1000
		}
	}
	full := n
	t.Logf("store full after %d keys; %d bytes free", full, freeBytes(t, dir))
	// The store refused a batch that did not fit; now the disk fills for
	// good (the filler grows to leave 8 MiB, half the reserve), so no
	// smaller batch fits either until the filler goes.
	grow(t, filler, freeBytes(t, dir)-8<<20)

	// Full: it keeps deciding, exactly, new keys and known ones.
	checkKeys(t, c, hot, 2, 5)
	for range 20 {
		checkKeys(t, c, keyRange("k", n, 1000), 1, 9)
		n += 1000
	}
	checkKeys(t, c, keyRange("k", 0, 1000), 1, 8) // flushed before the disk filled
	failures := metric(t, p, "sluice_store_flush_failures_total")
	waitFor(t, 10*time.Second, "flushes keep being tried and refused", func() bool {
		return metric(t, p, "sluice_store_flush_failures_total") > failures
	})
	if w, u := metric(t, p, "sluice_store_writable"), metric(t, p, "sluice_unflushed_keys"); w != 0 || u < 20_000 {
		t.Fatalf("while full: sluice_store_writable %v, sluice_unflushed_keys %v (want 0 and ≥ 20000)", w, u)
	}
	if code, body := readyz(t, p); code != 200 || !strings.HasPrefix(body, "ready, degraded: store not writable") {
		t.Fatalf("/readyz while full: %d %q", code, body)
	}
	if free := freeBytes(t, dir); free < 1<<20 {
		t.Fatalf("only %d bytes left on the disk: the store let it fill", free)
	}
	select {
	case <-p.exited:
		t.Fatalf("the node exited while its disk was full: %v", p.err)
	default:
	}

	// Space returns: it writes what it kept in memory and is plainly ready.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the store is writable and caught up", func() bool {
		return metric(t, p, "sluice_store_writable") == 1 && metric(t, p, "sluice_unflushed_keys") == 0
	})
	failures = metric(t, p, "sluice_store_flush_failures_total")
	checkKeys(t, c, keyRange("k", n, 1000), 1, 9) // more flushes, which succeed
	n += 1000
	flushed := func() bool { return metric(t, p, "sluice_unflushed_keys") == 0 }
	if !waitUntil(10*time.Second, flushed) {
		t.Fatalf("timed out after 10s waiting until the newest keys are flushed: sluice_unflushed_keys %v, "+
			"sluice_store_writable %v, flush failures %v → %v, %d bytes free",
			metric(t, p, "sluice_unflushed_keys"), metric(t, p, "sluice_store_writable"), failures,
			metric(t, p, "sluice_store_flush_failures_total"), freeBytes(t, dir))
	}
	if got := metric(t, p, "sluice_store_flush_failures_total"); got != failures {
		t.Fatalf("flush failures grew after the recovery: %v → %v", failures, got)
	}
	if code, body := readyz(t, p); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz after recovery: %d %q", code, body)
	}

	// A graceful stop and a restart keep every count.
	if err := p.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, p.log)
	}
	log := p.log.String()
	for _, want := range []struct {
		line     string
		min, max int
	}{
		// Twice when a refused batch was followed by a smaller one that
		// fit, before the filler grew.
		{"store is not writable", 1, 2},
		{"store writable again", 1, 2},
		{"store still not writable", 0, 2},
	} {
		if got := strings.Count(log, want.line); got < want.min || got > want.max {
			t.Errorf("%d log lines with %q, want %d to %d", got, want.line, want.min, want.max)
		}
	}
	p.start(t)
	c = dial(t, p.grpc)
	waitFor(t, 30*time.Second, "the restarted node is ready", func() bool {
		code, _ := readyz(t, p)
		return code == 200
	})
	checkKeys(t, c, hot, 0, 5)
	checkKeys(t, c, keyRange("k", 0, 1000), 0, 8)
	checkKeys(t, c, keyRange("k", full, 1000), 0, 9) // only in memory while the disk was full
	checkKeys(t, c, keyRange("k", n-1000, 1000), 0, 9)
	if err := p.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
		t.Fatalf("graceful stop after the restart: %v", err)
	}
}
