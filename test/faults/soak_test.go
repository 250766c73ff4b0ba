//go:build faults && linux

package faults

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// The soak: five hosts under steady mixed load, a fault
// every soakFaultEvery drawn from the harness's list, and each node's RSS,
// goroutines, open files and store size sampled every soakSampleEvery into
// a CSV. `make soak DURATION=10m` runs it and plots the CSV
// (test/soakplot.sh); without SLUICE_SOAK_DURATION it skips.
const (
	soakFaultEvery  = 30 * time.Second
	soakFaultHold   = 12 * time.Second // longer than failure detection (2–7 s here)
	soakSampleEvery = 10 * time.Second
	soakSettle      = 60 * time.Second // views must converge within this after a fault ends

	// The load: soakWorkers callers, each at most soakPerWorker calls/s, a
	// share soakBatchShare of them batches of 2..soakMaxBatch items.
	soakWorkers    = 4
	soakPerWorker  = 25
	soakBatchShare = 0.3
	soakMaxBatch   = 20
	soakKeys       = 200 // per algorithm
)

// soakAlgorithms are the load's limits: every algorithm, windows short
// enough that keys expire and come back during the run.
var soakAlgorithms = []struct {
	name   string
	alg    sluicev1.Algorithm
	limit  int64
	window time.Duration
}{
	{"soak.fixed", sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, 40, 10 * time.Second},
	{"soak.sliding", sluicev1.Algorithm_ALGORITHM_SLIDING_WINDOW, 40, 10 * time.Second},
	{"soak.log", sluicev1.Algorithm_ALGORITHM_SLIDING_LOG, 20, 5 * time.Second},
	{"soak.token", sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET, 30, 30 * time.Second},
	{"soak.leaky", sluicev1.Algorithm_ALGORITHM_LEAKY_BUCKET, 30, 30 * time.Second},
	{"soak.gcra", sluicev1.Algorithm_ALGORITHM_GCRA, 60, time.Minute},
}

// soakSample is one node's figures at one time; -1 where it could not be
// read (the process is down, or paused and its /metrics does not answer).
type soakSample struct {
	At              time.Duration
	Node            string
	PID             int
	RSS, Goroutines int64
	FDs, StoreBytes int64
	Fault           string
}

// soakCounts are the load's tallies: every call ends in exactly one of
// answered (each item a decision or an item error) or failed (an error for
// the call); anything else is a violation.
type soakCounts struct {
	calls, items, decided, itemErrors, failed, violations atomic.Int64
	mu                                                    sync.Mutex
	failedBy                                              map[string]int // fault in effect → failed calls
	firstViolations, firstItemErrors                      []string
}

func (s *soakCounts) violation(format string, args ...any) {
	s.violations.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.firstViolations) < 10 {
		s.firstViolations = append(s.firstViolations, fmt.Sprintf(format, args...))
	}
}

// soakDuration reads SLUICE_SOAK_DURATION; the test skips without it.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("SLUICE_SOAK_DURATION")
	if v == "" {
		t.Skip("the soak runs with SLUICE_SOAK_DURATION set (make soak DURATION=10m)")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute || d > 24*time.Hour {
		t.Fatalf("SLUICE_SOAK_DURATION=%q: want a duration from 1m to 24h (%v)", v, err)
	}
	// Room after the run: healing, the last settle, the checks, cleanup.
	if dl, ok := t.Deadline(); ok && time.Until(dl) < d+5*time.Minute {
		t.Fatalf("SLUICE_SOAK_DURATION=%v does not fit the test's -timeout (%v left): give -timeout of at least the duration + 5m (make soak SOAK_TIMEOUT=…)", d, time.Until(dl).Round(time.Second))
	}
	return d
}

// Long on purpose: one story (load, sampler, rounds of faults, CSVs), then its checks.
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	out := os.Getenv("SLUICE_SOAK_OUT")
	if out == "" {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SLUICE_SOAK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_SOAK_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("soak: %v, a fault every %v held %v, samples every %v, seed %d (SLUICE_SOAK_SEED=%d repeats the faults), output in %s",
		dur, soakFaultEvery, soakFaultHold, soakSampleEvery, seed, seed, out)

	c := New(t, 5)
	c.StartAll()
	begin := time.Now()
	since := func() time.Duration { return time.Since(begin) }

	var fault atomic.Pointer[string]
	none := "none"
	fault.Store(&none)
	// The host whose own process or links the fault is on (kill -9,
	// pause, packet loss), "" for none: calls to it may fail.
	var impaired atomic.Pointer[string]
	nobody := ""
	impaired.Store(&nobody)

	// The load.
	var counts soakCounts
	counts.failedBy = map[string]int{}
	ctx, stopLoad := context.WithCancel(context.Background())
	var loadWG sync.WaitGroup
	maxCalls := int64(float64(soakWorkers*soakPerWorker) * (dur + soakSettle).Seconds())
	paced(ctx, &loadWG, soakWorkers, soakPerWorker, maxCalls,
		func(w int) *rand.Rand { return rand.New(rand.NewPCG(seed, uint64(w)+1)) },
		func(rng *rand.Rand) { soakCall(c, rng, &counts, *fault.Load(), *impaired.Load()) })
	loadStopped := false
	stop := func() {
		if !loadStopped {
			loadStopped = true
			stopLoad()
			loadWG.Wait()
		}
	}
	t.Cleanup(stop)

	// The sampler.
	var (
		smu     sync.Mutex
		samples []soakSample
	)
	sctx, stopSampler := context.WithCancel(context.Background())
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		tick := time.NewTicker(soakSampleEvery)
		defer tick.Stop()
		for {
			s := sampleHosts(c, since(), *fault.Load())
			smu.Lock()
			samples = append(samples, s...)
			smu.Unlock()
			select {
			case <-sctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { stopSampler(); <-samplerDone })

	// The faults: each round of five is the list in a random order.
	type event struct {
		From, To time.Duration
		Kind     string
		Detail   string
	}
	var events []event
	frng := rand.New(rand.NewPCG(seed, 0))
	kinds := []string{"partition", "one-way loss", "packet loss", "pause", "kill -9"}
	var round []string
	for slot := soakFaultEvery; slot+soakFaultHold+5*time.Second <= dur; slot += soakFaultEvery {
		if wait := slot - since(); wait > 0 {
			time.Sleep(wait) // the schedule: a fault every 30 s (not a synchronisation)
		}
		if len(round) == 0 {
			round = slices.Clone(kinds)
			frng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		}
		kind := round[0]
		round = round[1:]
		perm := frng.Perm(len(c.Hosts))
		a, b := c.Hosts[perm[0]], c.Hosts[perm[1]]
		ev := event{From: since(), Kind: kind}
		label := kind
		if kind == "pause" || kind == "kill -9" || kind == "packet loss" {
			impaired.Store(&a.Name)
		}
		fault.Store(&label)
		var undo func()
		switch kind {
		case "partition":
			var s1, s2 []*Host
			for i, p := range perm {
				if i < 2 {
					s1 = append(s1, c.Hosts[p])
				} else {
					s2 = append(s2, c.Hosts[p])
				}
			}
			ev.Detail = names(s1) + " | " + names(s2)
			c.Partition(s1, s2)
			undo = c.Heal
		case "one-way loss":
			ev.Detail = a.Name + " deaf to " + b.Name
			c.DropFrom(a, b)
			undo = c.Heal
		case "packet loss":
			ev.Detail = a.Name + " drops 20 % of its packets"
			c.Lossy(a, 0.2)
			undo = c.Heal
		case "pause":
			ev.Detail = "SIGSTOP " + a.Name
			a.Pause()
			undo = a.Resume
		case "kill -9":
			ev.Detail = "SIGKILL " + a.Name + ", restart on its data dir once the others declare it dead"
			a.Kill9()
			undo = func() {
				var others []*Host
				for _, h := range c.Hosts {
					if h != a {
						others = append(others, h)
					}
				}
				c.WaitViews(soakSettle, others)
				a.Restart()
			}
		}
		time.Sleep(soakFaultHold - (since() - ev.From)) // the fault's length (not a synchronisation)
		undo()
		settled := c.WaitViews(soakSettle, c.Hosts)
		fault.Store(&none)
		impaired.Store(&nobody)
		ev.To = since()
		events = append(events, ev)
		t.Logf("%v–%v %s (%s); all five alive again %v after the fault ended",
			ev.From.Round(time.Second), ev.To.Round(time.Second), kind, ev.Detail, settled.Round(time.Millisecond))
	}
	if wait := dur - since(); wait > 0 {
		time.Sleep(wait) // the rest of the soak's length (not a synchronisation)
	}
	stop()
	stopSampler()
	<-samplerDone
	end := since()

	// The CSVs.
	smu.Lock()
	all := slices.Clone(samples)
	smu.Unlock()
	csvPath := filepath.Join(out, "soak.csv")
	rows := [][]string{{"elapsed_s", "node", "pid", "rss_bytes", "goroutines", "open_fds", "store_bytes", "fault"}}
	for _, s := range all {
		rows = append(rows, []string{strconv.FormatFloat(s.At.Seconds(), 'f', 1, 64), s.Node, strconv.Itoa(s.PID),
			cell(s.RSS), cell(s.Goroutines), cell(s.FDs), cell(s.StoreBytes), s.Fault})
	}
	writeCSV(t, csvPath, rows)
	evRows := [][]string{{"from_s", "to_s", "fault", "detail"}}
	for _, e := range events {
		evRows = append(evRows, []string{strconv.FormatFloat(e.From.Seconds(), 'f', 1, 64),
			strconv.FormatFloat(e.To.Seconds(), 'f', 1, 64), e.Kind, e.Detail})
	}
	writeCSV(t, filepath.Join(out, "soak-faults.csv"), evRows)
	t.Logf("wrote %s (%d samples) and soak-faults.csv (%d faults) in %s", csvPath, len(all), len(events), out)

	// Every check got a decision or an error.
	counts.mu.Lock()
	var byFault []string
	for k, v := range counts.failedBy {
		byFault = append(byFault, fmt.Sprintf("%s: %d", k, v))
	}
	slices.Sort(byFault)
	counts.mu.Unlock()
	t.Logf("load over %v: %d calls (%d items): %d items decided, %d item errors, %d calls failed (by fault in effect: %s); %d without a decision or an error",
		end.Round(time.Second), counts.calls.Load(), counts.items.Load(), counts.decided.Load(), counts.itemErrors.Load(),
		counts.failed.Load(), strings.Join(byFault, ", "), counts.violations.Load())
	for _, e := range counts.firstItemErrors {
		t.Logf("item error %s", e)
	}
	if n := counts.violations.Load(); n > 0 {
		t.Errorf("%d answers were neither a decision nor an error, or out of range: %s", n, strings.Join(counts.firstViolations, "; "))
	}
	if counts.calls.Load() == 0 || counts.decided.Load() == 0 {
		t.Errorf("the load decided nothing")
	}

	// Flat after warm-up.
	judgeFlat(t, all, dur)
}

func names(hs []*Host) string {
	var s []string
	for _, h := range hs {
		s = append(s, h.Name)
	}
	return strings.Join(s, ",")
}

func cell(v int64) string {
	if v < 0 {
		return ""
	}
	return strconv.FormatInt(v, 10)
}

func writeCSV(t *testing.T, path string, rows [][]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		f.Close()
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// soakCall sends one call, single or batched, to a random host and tallies
// its answer.
func soakCall(c *Cluster, rng *rand.Rand, counts *soakCounts, fault, impaired string) {
	n := 1
	if rng.Float64() < soakBatchShare {
		n = 2 + rng.IntN(soakMaxBatch-1)
	}
	req := &sluicev1.CheckRequest{}
	limits := make([]int64, n)
	for i := range n {
		a := soakAlgorithms[rng.IntN(len(soakAlgorithms))]
		limits[i] = a.limit
		req.Requests = append(req.Requests, &sluicev1.RateLimitRequest{
			Name: a.name, Key: fmt.Sprint("k:", rng.IntN(soakKeys)), Hits: proto.Int64(1),
			Limit: a.limit, WindowMs: a.window.Milliseconds(), Algorithm: a.alg,
		})
	}
	h := c.Hosts[rng.IntN(len(c.Hosts))]
	ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
	defer cancel()
	counts.calls.Add(1)
	counts.items.Add(int64(n))
	resp, err := h.Client().Check(ctx, req)
	if err != nil {
		counts.failed.Add(1)
		counts.mu.Lock()
		via := "through a host the fault is not on"
		if h.Name == impaired {
			via = "through the host it is on"
		}
		counts.failedBy[fault+", "+via]++
		counts.mu.Unlock()
		return
	}
	if len(resp.Responses) != n {
		counts.violation("through %s: %d answers for %d items", h.Name, len(resp.Responses), n)
		return
	}
	for i, r := range resp.Responses {
		switch {
		case r.Error != "":
			counts.itemErrors.Add(1)
			counts.mu.Lock()
			if len(counts.firstItemErrors) < 5 {
				counts.firstItemErrors = append(counts.firstItemErrors, fmt.Sprintf("through %s during %s: %s %s: %s", h.Name, fault, req.Requests[i].Name, req.Requests[i].Key, r.Error))
			}
			counts.mu.Unlock()
		case r.Status != sluicev1.Status_STATUS_UNDER_LIMIT && r.Status != sluicev1.Status_STATUS_OVER_LIMIT:
			counts.violation("through %s: item %d (%s %s) has status %v and no error", h.Name, i, req.Requests[i].Name, req.Requests[i].Key, r.Status)
		case r.Remaining < 0 || r.Remaining > limits[i] || r.ResetAfterMs < 0 || r.RetryAfterMs < 0:
			counts.violation("through %s: item %d (%s %s) out of range: remaining %d of %d, reset %d ms, retry %d ms",
				h.Name, i, req.Requests[i].Name, req.Requests[i].Key, r.Remaining, limits[i], r.ResetAfterMs, r.RetryAfterMs)
		default:
			counts.decided.Add(1)
		}
	}
}

// sampleHosts reads every host's figures at once (a paused host's /metrics
// takes up to the HTTP client's 5 s timeout).
func sampleHosts(c *Cluster, at time.Duration, fault string) []soakSample {
	out := make([]soakSample, len(c.Hosts))
	var wg sync.WaitGroup
	for i, h := range c.Hosts {
		wg.Go(func() {
			s := soakSample{At: at, Node: h.Name, RSS: -1, Goroutines: -1, FDs: -1, StoreBytes: -1, Fault: fault}
			s.StoreBytes = dirSize(h.DataDir)
			if !h.Exited() {
				s.PID = h.PID()
				// A process killed but not yet reaped shows no memory and
				// no files: not a sample.
				if s.RSS = procRSS(s.PID); s.RSS == 0 {
					s.RSS = -1
				}
				if s.FDs = procFDs(s.PID); s.FDs == 0 {
					s.FDs = -1
				}
				if v, ok := h.Metric("go_goroutines"); ok {
					s.Goroutines = int64(v)
				}
			}
			out[i] = s
		})
	}
	wg.Wait()
	return out
}

// procRSS is VmRSS of /proc/pid/status in bytes, or -1.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			if v, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return v << 10
			}
		}
	}
	return -1
}

// procFDs counts /proc/pid/fd, or -1.
func procFDs(pid int) int64 {
	e, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return int64(len(e))
}

// dirSize sums the sizes of the regular files under dir (files removed
// while it walks are skipped), or -1.
func dirSize(dir string) int64 {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		return -1
	}
	return n
}

// Allowances of the flatness check beyond the base third's own spread, for
// what legitimately varies between two samples of a process that does not
// leak:
//   - goroutines: each call in flight holds one on the host it entered and
//     one on its key's owner (2 × soakWorkers), and each of a node's gRPC
//     connections (4 peers and the test's client) runs up to 4 (reader,
//     writer, keepalive, stream handler), so a sample taken while they
//     reconnect after a fault may count them twice.
//   - open files: each of those 5 connections may be open twice while its
//     replacement connects; the store opens a new WAL and MANIFEST and the
//     output tables of a flush or compaction (4: pebble's L0 compaction
//     threshold) before it closes the old ones.
//   - store size: a WAL grows to pebble's memtable size (4 MiB) before it
//     is rotated, and the old one is kept for recycling: 2 × 4 MiB.
//   - RSS: the heap floor of `sluice serve` (--gc-min-heap, 64 MiB by
//     default) lets the heap take up to that much garbage before a
//     collection (about a second of allocation: a burst after a fault ends
//     is more), and the runtime returns freed pages to the system only
//     gradually, so a process that does not leak may sit anywhere from its
//     live heap to 64 MiB above it.
var soakAllowance = map[string]int64{
	"goroutines":  2*soakWorkers + 4*5,
	"open_fds":    2*5 + 2 + 4,
	"store_bytes": 2 * 4 << 20,
	"rss_bytes":   64 << 20,
}

// judgeFlat checks that every node's figures are flat after warm-up. The
// warm-up is the first fifth of the run, at least two sample intervals; a
// process's samples count only once it has run that long itself (a node
// restarted by a kill -9 warms up again). Of the time after the warm-up,
// the first third is the base and the last third the end. Criterion, per
// node and figure: max(end) ≤ max(base) + max(spread(base), allowance),
// spread = max − min. A leak that grows with time, calls, keys or faults
// shows as an end above that; what a process does in every cycle of the
// load and the faults is already inside the base's spread.
func judgeFlat(t *testing.T, all []soakSample, dur time.Duration) {
	t.Helper()
	warm := max(2*soakSampleEvery, dur/5)
	third := (dur - warm) / 3
	baseEnd, finalFrom := warm+third, dur-third
	t.Logf("flatness: warm-up %v (and %v after each restart); base %v–%v, end %v–%v; criterion max(end) ≤ max(base) + max(max(base) − min(base), allowance)",
		warm, warm, warm, baseEnd.Round(time.Second), finalFrom.Round(time.Second), dur)
	firstSeen := map[int]time.Duration{}
	for _, s := range all {
		if s.PID == 0 {
			continue
		}
		if at, ok := firstSeen[s.PID]; !ok || s.At < at {
			firstSeen[s.PID] = s.At
		}
	}
	figures := []struct {
		name string
		get  func(soakSample) int64
	}{
		{"rss_bytes", func(s soakSample) int64 { return s.RSS }},
		{"goroutines", func(s soakSample) int64 { return s.Goroutines }},
		{"open_fds", func(s soakSample) int64 { return s.FDs }},
		{"store_bytes", func(s soakSample) int64 { return s.StoreBytes }},
	}
	nodes := map[string]bool{}
	for _, s := range all {
		nodes[s.Node] = true
	}
	var order []string
	for n := range nodes {
		order = append(order, n)
	}
	slices.Sort(order)
	for _, f := range figures {
		for _, n := range order {
			var base, end []int64
			for _, s := range all {
				v := f.get(s)
				if s.Node != n || v < 0 || s.At < warm {
					continue
				}
				// A process's own warm-up; store size belongs to the
				// data dir, which outlives the process.
				if f.name != "store_bytes" && (s.PID == 0 || s.At-firstSeen[s.PID] < warm) {
					continue
				}
				switch {
				case s.At < baseEnd:
					base = append(base, v)
				case s.At >= finalFrom:
					end = append(end, v)
				}
			}
			if len(base) == 0 || len(end) == 0 {
				t.Logf("%s %s: %d base and %d end samples: not judged", n, f.name, len(base), len(end))
				continue
			}
			bmax, bmin, emax := slices.Max(base), slices.Min(base), slices.Max(end)
			allow := max(bmax-bmin, soakAllowance[f.name])
			verdict := "flat"
			if emax > bmax+allow {
				verdict = "GROWS"
				t.Errorf("%s %s grows: end max %d > base max %d + allowance %d (base %v, end %v)", n, f.name, emax, bmax, allow, base, end)
			}
			t.Logf("%s %-11s base %d samples, min %d max %d; end %d samples, max %d; bound %d (allowance %d): %s",
				n, f.name, len(base), bmin, bmax, len(end), emax, bmax+allow, allow, verdict)
		}
	}
}
