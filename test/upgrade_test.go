package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// previousRelease is the commit of main whose binary TestRollingUpgrade
// starts from: the release before versions were reported (its nodes
// answer Status without a version, and refuse gossip metadata with
// unknown flags or extra bytes).
const previousRelease = "350c224ccd38e6b8a74d9e19e1bc3ded9e731aae"

// buildPrevious builds cmd/sluice of commit rev, taken from this
// checkout's git history, into a temp dir, or skips the test when git or
// the commit is not there (a shallow clone, a source archive).
func buildPrevious(t *testing.T, rev string) string {
	t.Helper()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Skip("git is not installed: cannot build the previous release from history")
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..")
	if out, err := exec.Command(git, "-C", root, "cat-file", "-e", rev+"^{commit}").CombinedOutput(); err != nil {
		t.Skipf("commit %s is not in this checkout's history (a shallow clone?): %v %s", rev[:12], err, out)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", `"$1" -C "$2" archive "$3" | tar -x -C "$4"`, "sh", git, root, rev, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v\n%s", rev[:12], err, out)
	}
	bin := filepath.Join(t.TempDir(), "sluice-"+rev[:7])
	// -trimpath: the build cache then serves the packages that did not
	// change since, whatever the temp dir's name.
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", bin, "./cmd/sluice")
	build.Dir = src
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", rev[:12], err, out)
	}
	t.Logf("built the previous release %s in %v", rev[:12], time.Since(start).Round(100*time.Millisecond))
	return bin
}

// statusVersions runs `sluice status --json` (this tree's binary) against
// addr and returns each member's version, "" where it said none.
func statusVersions(t *testing.T, addr string) map[string]string {
	t.Helper()
	out, code := runCLI(t, "status", "--addr", addr, "--json")
	if code != 0 {
		t.Fatalf("sluice status --addr %s exited %d: %s", addr, code, out)
	}
	var st struct {
		Members []struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("sluice status --json printed %q: %v", out, err)
	}
	vs := map[string]string{}
	for _, m := range st.Members {
		vs[m.Name] = m.Version
	}
	return vs
}

// TestRollingUpgrade: three nodes of the previous release under an
// outside load on every node; each is replaced in turn by this tree's
// binary (SIGTERM, start the new one on the same address and data dir,
// wait until every node sees every node alive). Through the mixed
// cluster nothing is over its limit, no admitted hit is lost, no call
// fails, and `sluice status` on a new node tells new members' version
// from old ones' ("unknown").
//
// Building the previous release from scratch takes minutes on a small
// machine, so `go test ./test/` skips this; `make upgrade-test` runs it.
func TestRollingUpgrade(t *testing.T) {
	if os.Getenv("SLUICE_TEST_UPGRADE") == "" {
		t.Skip("builds the previous release from git history (minutes on a cold build cache): run it with make upgrade-test (SLUICE_TEST_UPGRADE=1)")
	}
	// Not parallel: three processes under load on a 2-core machine.
	oldBin, newBin := buildPrevious(t, previousRelease), sluiceBinary(t)
	out, err := exec.Command(newBin, "version").Output()
	if err != nil {
		t.Fatalf("sluice version: %v", err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	newVersion, ok := strings.CutPrefix(first, "sluice ")
	if !ok || newVersion == "" {
		t.Fatalf("sluice version printed %q", out)
	}
	if err := exec.Command(oldBin, "version").Run(); err == nil {
		t.Fatalf("the previous release %s knows `sluice version`: it is not the release before versions", previousRelease[:12])
	}

	ps := make([]*proc, 3)
	for i := range ps {
		ps[i] = newProc(t, i, fmt.Sprintf("127.0.0.%d", 40+i))
		ps[i].bin = oldBin
		if i > 0 {
			ps[i].join = []string{ps[0].gossip}
		}
		ps[i].start(t)
	}
	waitMembers(t, ps)
	t.Logf("3 nodes of %s formed a cluster", previousRelease[:12])

	l := newLoad(50)
	l.setTargets(clientsOf(t, ps)...)
	stop, done := make(chan struct{}), make(chan struct{})
	// Paced at 3,000 calls a second (6 workers, a call each every 2 ms), so
	// that the load does not follow the machine's speed. Unpaced, a fast
	// machine ran 12,000 calls a second, and in half the runs 11–62 hits
	// of loose keys were counted twice (never admitted over a limit), at
	// this build and the one before: docs/guarantees.md ("Where the
	// promise is not yet kept"). Bounded by time (and stop) rather than by
	// count: each replacement waits for 1,000 calls more.
	l.every = 2 * time.Millisecond
	if os.Getenv("SLUICE_TEST_UNPACED") != "" {
		l.every = 0
	}
	go func() { l.run(t, 6, 2_000_000, 120*time.Second, stop); close(done) }()
	waitCalls(t, l, 1000)

	for i, p := range ps {
		others := append(append([]*proc{}, ps[:i]...), ps[i+1:]...)
		l.setTargets(clientsOf(t, others)...)
		l.noteStopping(t, p)
		start := time.Now()
		if err := p.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s (previous release) exited with %v after SIGTERM", p.name, err)
		}
		waitMembers(t, others)
		p.bin = newBin
		if i == 0 {
			p.join = []string{ps[1].gossip}
		}
		p.start(t)
		waitMembers(t, ps)
		l.setTargets(clientsOf(t, ps)...)
		t.Logf("%s replaced by %s in %v; %d calls so far, tight keys %d over their limits",
			p.name, newVersion, time.Since(start).Round(time.Millisecond), l.calls.Load(), l.tightOver())

		// The new nodes say their version; the old ones do not.
		vs := statusVersions(t, p.grpc)
		for j, q := range ps {
			want := ""
			if j <= i {
				want = newVersion
			}
			if got, ok := vs[q.name]; !ok || got != want {
				t.Errorf("after replacing %d nodes, sluice status on %s says %s runs %q, want %q (all: %v)", i+1, p.name, q.name, got, want, vs)
			}
		}
		if i == 0 {
			text, code := runCLI(t, "status", "--addr", p.grpc)
			if code != 0 || strings.Count(text, " unknown ") != 2 || strings.Count(text, " "+newVersion+" ") != 1 {
				t.Errorf("sluice status on the first new node should show %s for it and unknown for the two old ones (exit %d):\n%s", newVersion, code, text)
			}
			t.Logf("sluice status in the mixed cluster:\n%s", text)
		}
		waitCalls(t, l, l.calls.Load()+1000)
	}
	close(stop)
	<-done

	// Graceful stops and starts: exactness is promised, across the two
	// releases as within one (docs/upgrading.md).
	lost := l.verify(t, dial(t, ps[0].grpc), ps, exact)
	l.noCallErrors(t, "rolling upgrade")
	var attempted, exactKeys int
	for _, k := range l.tight {
		l.histMu.Lock()
		n := len(l.hist[k])
		l.histMu.Unlock()
		got := l.admitted[k].Load()
		if n >= int(l.tightLimit) {
			attempted++
			// One node would admit exactly the limit of at least as many
			// calls.
			if got == l.tightLimit {
				exactKeys++
			} else {
				t.Errorf("tight key %s: %d calls, %d admitted; one node admits exactly %d", k, n, got, l.tightLimit)
			}
		}
	}
	var looseAdmitted int64
	for _, k := range l.loose {
		looseAdmitted += l.admitted[k].Load()
	}
	t.Logf("rolling upgrade %s → %s of 3 nodes under load: %d calls, %d errors, max latency %v, %d calls over 1 s; tight keys: %d over their limits, %d of %d keys with at least %d calls admitted exactly %d; loose keys: %d hits admitted, %d no longer counted",
		previousRelease[:7], newVersion, l.calls.Load(), l.callErrors.Load(), time.Duration(l.maxLatency.Load()).Round(time.Millisecond), l.slow.Load(),
		l.tightOver(), exactKeys, attempted, l.tightLimit, l.tightLimit, looseAdmitted, lost)
	if attempted == 0 {
		t.Error("no tight key had as many calls as its limit: the load proved nothing")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range ps {
		st, err := dial(t, p.grpc).Status(ctx)
		if err != nil || st.Version != newVersion {
			t.Errorf("after the upgrade, %s's status says version %q (err %v), want %q", p.name, st.GetVersion(), err, newVersion)
		}
	}
}
