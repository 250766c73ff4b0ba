package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// benchResult is the summary `sluice bench --json` prints.
type benchResult struct {
	Addrs        []string `json:"addrs"`
	Envoy        string   `json:"envoy,omitempty"`
	Concurrency  int      `json:"concurrency"`
	Batch        int      `json:"batch"`
	Keys         int      `json:"keys"`
	Seconds      float64  `json:"seconds"`
	Calls        int64    `json:"calls"`
	Checks       int64    `json:"checks"`
	Allowed      int64    `json:"allowed"`
	Over         int64    `json:"over"`
	ItemErrors   int64    `json:"item_errors"`
	CallErrors   int64    `json:"call_errors"`
	ChecksPerSec float64  `json:"checks_per_sec"`
	CallsPerSec  float64  `json:"calls_per_sec"`
	P50us        float64  `json:"p50_us"`
	P90us        float64  `json:"p90_us"`
	P99us        float64  `json:"p99_us"`
	MaxUs        float64  `json:"max_us"`
	FirstError   string   `json:"first_error,omitempty"`
	// With --owner-aware: checks sent straight to their owner, to any node
	// (no table, or the owner failed), and decided by another node than
	// the table's owner (the cluster forwarded them).
	OwnerAware    bool   `json:"owner_aware,omitempty"`
	OwnerRouted   uint64 `json:"owner_routed,omitempty"`
	OwnerFallback uint64 `json:"owner_fallback,omitempty"`
	OwnerMoved    uint64 `json:"owner_moved,omitempty"`
}

// benchOptions are the flags of `sluice bench`.
type benchOptions struct {
	addrs       []string // --addr, split at commas
	conc        int
	batch       int
	keys        int
	sequential  bool
	name        string
	envoy       string
	limit       int64
	window      time.Duration
	alg         bucket.Algorithm
	duration    time.Duration
	maxCalls    int64
	every       time.Duration
	callTimeout time.Duration
	asJSON      bool
	conns       int
	ownerAware  bool
	ownerBatch  bool
	cpuProfile  string
	sec         clientFlags
	gcMinHeap   byteSize
}

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	defer startGCFloor(uint64(o.gcMinHeap))()
	conns, err := dialBench(ctx, o)
	defer conns.close()
	if err != nil {
		return err
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	res := runBench(ctx, o, conns, stdout)
	if owned := conns.owned; owned != nil {
		st := owned.OwnerStats()
		res.OwnerAware, res.OwnerRouted, res.OwnerFallback, res.OwnerMoved = true, st.Routed, st.Fallback, st.Moved
	}
	if o.asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
	} else {
		printBench(stdout, &res)
	}
	if res.Calls == 0 {
		if res.FirstError != "" {
			return fmt.Errorf("no call succeeded: %s", res.FirstError)
		}
		return errors.New("no call succeeded")
	}
	return nil
}

// parseBenchFlags parses and checks the flags of `sluice bench`.
func parseBenchFlags(args []string, stderr io.Writer) (*benchOptions, error) {
	o := &benchOptions{gcMinHeap: byteSize(DefaultGCMinHeap)}
	fs := flag.NewFlagSet("sluice bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addrs := fs.String("addr", "127.0.0.1:8081", "gRPC address(es) of the node(s) to load, comma-separated (callers spread over them)")
	fs.IntVar(&o.conc, "concurrency", 50, "concurrent callers")
	fs.IntVar(&o.batch, "batch", 1, "checks per call (1..1000)")
	fs.IntVar(&o.keys, "keys", 10_000, "distinct keys")
	fs.BoolVar(&o.sequential, "sequential", false, "take the keys in order (key:0, key:1, …, then again from key:0) instead of at random: with --calls keys/batch, every key once")
	fs.StringVar(&o.name, "name", "bench", "limit name of every check (with --envoy: the key of every descriptor's entry)")
	fs.StringVar(&o.envoy, "envoy", "", "call envoy.service.ratelimit.v3 ShouldRateLimit for this domain instead of Check: --batch descriptors per call, each {NAME: KEY}; the node's rules give the limit")
	fs.Int64Var(&o.limit, "limit", 1<<40, "limit of every key (the default admits everything)")
	fs.DurationVar(&o.window, "window", time.Minute, "window of every key")
	algorithm := fs.String("algorithm", "sliding_window", "algorithm of every key: sliding_window|sliding_log|token_bucket|leaky_bucket|fixed_window|gcra")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to run (the run also stops after --calls)")
	fs.Int64Var(&o.maxCalls, "calls", 0, "stop after this many calls (0: only --duration)")
	fs.DurationVar(&o.every, "progress", time.Second, "progress line interval (0: none)")
	fs.DurationVar(&o.callTimeout, "timeout", 5*time.Second, "deadline of each call")
	fs.BoolVar(&o.asJSON, "json", false, "print the summary as JSON")
	fs.IntVar(&o.conns, "conns", 2, "gRPC connections per address (callers spread over them); with --owner-aware, one per member")
	fs.BoolVar(&o.ownerAware, "owner-aware", false, "learn the owner table from the nodes of --addr and send each check straight to its key's owner (client.WithOwnerRouting) instead of to any node")
	fs.BoolVar(&o.ownerBatch, "owner-batches", false, "with --owner-aware: fill each caller's batches with keys of one owner (the callers spread over the owners), so that a batch is one call to its owner, as it is with one node, instead of one call per owner")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the load generator to this file")
	o.sec.register(fs, false)
	fs.Var(&o.gcMinHeap, "gc-min-heap", "the load generator's garbage collector lets the heap grow to at least this size before it collects (as for serve); 0 turns the floor off")
	if err := parseWithEnv(fs, args); err != nil {
		return nil, err
	}
	o.addrs = strings.Split(*addrs, ",")
	alg, err := bucket.ParseAlgorithm(*algorithm)
	if err != nil {
		return nil, fmt.Errorf("--algorithm: %w", err)
	}
	o.alg = alg
	switch {
	case o.conc < 1 || o.conc > 10_000:
		return nil, fmt.Errorf("--concurrency %d: want 1..10000", o.conc)
	case o.batch < 1 || o.batch > 1000:
		return nil, fmt.Errorf("--batch %d: want 1..1000", o.batch)
	case o.conns < 1 || o.conns > 1000:
		return nil, fmt.Errorf("--conns %d: want 1..1000", o.conns)
	case o.keys < 1:
		return nil, fmt.Errorf("--keys %d: want at least 1", o.keys)
	case o.duration <= 0 || o.duration > 24*time.Hour:
		return nil, fmt.Errorf("--duration %v: want a positive duration up to 24h", o.duration)
	case o.window < time.Millisecond:
		return nil, fmt.Errorf("--window %v: want at least 1ms", o.window)
	case o.ownerBatch && !o.ownerAware:
		return nil, errors.New("--owner-batches groups keys by the owner table of --owner-aware: give both")
	case o.ownerBatch && o.sequential:
		return nil, errors.New("--owner-batches takes each owner's keys at random: it does not go with --sequential")
	case o.ownerAware && o.envoy != "":
		return nil, errors.New("--owner-aware routes the native Check API: it does not go with --envoy")
	case alg == bucket.SlidingLog && o.limit > bucket.MaxLogLimit:
		return nil, fmt.Errorf("--algorithm sliding_log keeps one timestamp per hit: give a --limit of at most %d", bucket.MaxLogLimit)
	}
	return o, nil
}

// benchConns are the connections a bench run loads: an owner-routing
// client with --owner-aware, else --conns clients per address.
type benchConns struct {
	clients []*client.Node
	owned   *client.Client
}

func (c *benchConns) close() {
	if c.owned != nil {
		c.owned.Close()
	}
	for _, cl := range c.clients {
		cl.Close()
	}
}

// dialBench connects to the addresses of o. On an error, what it returns
// holds the connections made so far, to close.
func dialBench(ctx context.Context, o *benchOptions) (*benchConns, error) {
	c := &benchConns{}
	opts, err := o.sec.dialOptions()
	if err != nil {
		return c, err
	}
	if !o.ownerAware {
		for range o.conns {
			for _, a := range o.addrs {
				cl, err := client.Dial(strings.TrimSpace(a), opts...)
				if err != nil {
					return c, fmt.Errorf("%s: %w", a, err)
				}
				c.clients = append(c.clients, cl)
			}
		}
		return c, nil
	}
	trimmed := make([]string, len(o.addrs))
	for i, a := range o.addrs {
		trimmed[i] = strings.TrimSpace(a)
	}
	owned, err := client.New(trimmed, client.WithDialOptions(opts...), client.WithOwnerRouting(0))
	if err != nil {
		return c, err
	}
	c.owned = owned
	rctx, rcancel := context.WithTimeout(ctx, o.callTimeout)
	err = owned.RefreshOwners(rctx)
	rcancel()
	if err != nil {
		return c, fmt.Errorf("--owner-aware: %w", err)
	}
	return c, nil
}

// benchStats are what the callers of a bench run count, concurrently.
type benchStats struct {
	lat                                     histogram
	issued, checks, allowed, over, itemErrs atomic.Int64
	callErrs                                atomic.Int64
	firstErr                                atomic.Pointer[string]
	nextKey                                 atomic.Uint64
}

// runBench runs o.conc callers until o.duration has passed (or o.maxCalls
// calls were made), printing a progress line every o.every unless o.asJSON,
// and returns what they counted.
func runBench(ctx context.Context, o *benchOptions, conns *benchConns, stdout io.Writer) benchResult {
	keyNames := make([]string, o.keys)
	for i := range keyNames {
		keyNames[i] = fmt.Sprint("key:", i)
	}
	groups := [][]string{keyNames}
	if o.ownerBatch {
		groups = keysByOwner(conns.owned, o.name, keyNames)
	}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var (
		st benchStats
		wg sync.WaitGroup
	)
	start := time.Now()
	for w := range o.conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			st.caller(ctx, runCtx, o, benchCallOf(o, conns, w), groups[w%len(groups)], rng)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if o.every > 0 && !o.asJSON {
		st.progress(stdout, o.every, start, done)
	}
	<-done
	secs := time.Since(start).Seconds()
	lat := &st.lat
	res := benchResult{
		Addrs: o.addrs, Envoy: o.envoy, Concurrency: o.conc, Batch: o.batch, Keys: o.keys, Seconds: secs,
		Calls: lat.count(), Checks: st.checks.Load(), Allowed: st.allowed.Load(), Over: st.over.Load(),
		ItemErrors: st.itemErrs.Load(), CallErrors: st.callErrs.Load(),
		ChecksPerSec: float64(st.checks.Load()) / secs, CallsPerSec: float64(lat.count()) / secs,
		P50us: lat.quantile(0.50), P90us: lat.quantile(0.90), P99us: lat.quantile(0.99), MaxUs: lat.quantile(1),
	}
	if p := st.firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	return res
}

// keysByOwner groups keys (of limit name) by their owner in c's table,
// in the order of the owners' names. Keys whose owner c cannot name (no
// table: Owner gives "") make a group of their own.
func keysByOwner(c *client.Client, name string, keys []string) [][]string {
	by := map[string][]string{}
	for _, k := range keys {
		o, _ := c.Owner(name, k)
		by[o] = append(by[o], k)
	}
	owners := slices.Sorted(maps.Keys(by))
	groups := make([][]string, len(owners))
	for i, o := range owners {
		groups[i] = by[o]
	}
	return groups
}

// benchCallOf is the call caller w makes: an owner-routed Check, Envoy's
// ShouldRateLimit or a Check, on its share of the connections.
func benchCallOf(o *benchOptions, conns *benchConns, w int) benchCall {
	tmpl := &sluicev1.RateLimitRequest{Name: o.name, Hits: proto.Int64(1), Limit: o.limit, WindowMs: o.window.Milliseconds(), Algorithm: sluicev1.Algorithm(o.alg)}
	switch {
	case conns.owned != nil:
		return benchCheck(conns.owned.CheckProto, o.batch, tmpl)
	case o.envoy != "":
		return benchEnvoy(rlsv3.NewRateLimitServiceClient(conns.clients[w%len(conns.clients)].Conn()), o.envoy, o.name, o.batch)
	}
	return benchCheck(conns.clients[w%len(conns.clients)].Check, o.batch, tmpl)
}

// caller makes calls until runCtx ends or the run's budget of calls is
// spent, counting them in st. Each call has its own deadline, from ctx: the
// end of the run stops new calls but does not cut off the ones in flight.
func (st *benchStats) caller(ctx, runCtx context.Context, o *benchOptions, call benchCall, keyNames []string, rng *rand.Rand) {
	budget := o.maxCalls
	keys := make([]string, o.batch)
	for runCtx.Err() == nil {
		if budget > 0 && st.issued.Add(1) > budget {
			return
		}
		for i := range keys {
			if o.sequential {
				keys[i] = keyNames[(st.nextKey.Add(1)-1)%uint64(len(keyNames))]
			} else {
				keys[i] = keyNames[rng.IntN(len(keyNames))]
			}
		}
		t := time.Now()
		cctx, ccancel := context.WithTimeout(ctx, o.callTimeout)
		n, ok, overLimit, itemErr, err := call(cctx, keys)
		ccancel()
		d := time.Since(t)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			st.callErrs.Add(1)
			msg := err.Error()
			st.firstErr.CompareAndSwap(nil, &msg)
			continue
		}
		st.lat.record(d)
		st.checks.Add(n)
		st.allowed.Add(ok)
		st.over.Add(overLimit)
		if itemErr != "" {
			st.itemErrs.Add(n - ok - overLimit)
			st.firstErr.CompareAndSwap(nil, &itemErr)
		}
	}
}

// progress prints a line every interval from start until done is closed.
func (st *benchStats) progress(stdout io.Writer, every time.Duration, start time.Time, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastChecks int64
	lastAt := start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			c := st.checks.Load()
			fmt.Fprintf(stdout, "%6.1fs  %9d checks  %9.0f checks/s  p50 %7.0fµs  p99 %7.0fµs  errors %d\n",
				now.Sub(start).Seconds(), c, float64(c-lastChecks)/now.Sub(lastAt).Seconds(),
				st.lat.quantile(0.50), st.lat.quantile(0.99), st.callErrs.Load()+st.itemErrs.Load())
			lastChecks, lastAt = c, now
		}
	}
}

// printBench prints the summary of a run for a reader.
func printBench(stdout io.Writer, res *benchResult) {
	fmt.Fprintf(stdout, "\n%d calls of %d checks, %d callers, %d keys, %.1fs\n", res.Calls, res.Batch, res.Concurrency, res.Keys, res.Seconds)
	fmt.Fprintf(stdout, "checks/s %.0f   calls/s %.0f\n", res.ChecksPerSec, res.CallsPerSec)
	fmt.Fprintf(stdout, "latency per call: p50 %.0fµs  p90 %.0fµs  p99 %.0fµs  max %.0fµs\n", res.P50us, res.P90us, res.P99us, res.MaxUs)
	fmt.Fprintf(stdout, "allowed %d  over limit %d  item errors %d  call errors %d\n", res.Allowed, res.Over, res.ItemErrors, res.CallErrors)
	if res.OwnerAware {
		fmt.Fprintf(stdout, "owner-aware: %d checks sent to their owner, %d to any node, %d decided by another node\n", res.OwnerRouted, res.OwnerFallback, res.OwnerMoved)
	}
	if res.FirstError != "" {
		fmt.Fprintf(stdout, "first error: %s\n", res.FirstError)
	}
}

// benchCall makes one call with the given keys and returns how many
// checks were answered, allowed and over the limit, and the first item
// error (the rest of the answered checks are item errors).
type benchCall func(ctx context.Context, keys []string) (n, allowed, over int64, itemErr string, err error)

// benchCheck calls check (a node's Check, or an owner-routing client's
// CheckProto) with one item per key, each a copy of tmpl.
func benchCheck(check func(context.Context, *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error), batch int, tmpl *sluicev1.RateLimitRequest) benchCall {
	req := &sluicev1.CheckRequest{Requests: make([]*sluicev1.RateLimitRequest, batch)}
	for i := range req.Requests {
		req.Requests[i] = proto.CloneOf(tmpl)
	}
	return func(ctx context.Context, keys []string) (n, allowed, over int64, itemErr string, err error) {
		for i, r := range req.Requests {
			r.Key = keys[i]
		}
		resp, err := check(ctx, req)
		if err != nil {
			return 0, 0, 0, "", err
		}
		for _, r := range resp.Responses {
			switch {
			case r.Error != "":
				if itemErr == "" {
					itemErr = r.Error
				}
			case r.Status == sluicev1.Status_STATUS_OVER_LIMIT:
				over++
			default:
				allowed++
			}
		}
		return int64(len(resp.Responses)), allowed, over, itemErr, nil
	}
}

// benchEnvoy calls ShouldRateLimit in domain with one descriptor
// {entryKey: key} per key, as Envoy's rate limit filter does.
func benchEnvoy(c rlsv3.RateLimitServiceClient, domain, entryKey string, batch int) benchCall {
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: make([]*rlcommon.RateLimitDescriptor, batch)}
	for i := range req.Descriptors {
		req.Descriptors[i] = &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: entryKey}}}
	}
	return func(ctx context.Context, keys []string) (n, allowed, over int64, itemErr string, err error) {
		for i, d := range req.Descriptors {
			d.Entries[0].Value = keys[i]
		}
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			return 0, 0, 0, "", err
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			return 0, 0, 0, "", fmt.Errorf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		for _, st := range resp.Statuses {
			if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				over++
			} else {
				allowed++
			}
		}
		return int64(len(resp.Statuses)), allowed, over, "", nil
	}
}

// histogram is a lock-free log-linear latency histogram: 16 sub-buckets per
// power of two of nanoseconds (relative error ≤ 6.25%).
type histogram struct {
	buckets [64 * 16]atomic.Int64
	n       atomic.Int64
}

func bucketOf(ns uint64) int {
	if ns < 16 {
		return int(ns)
	}
	e := bits.Len64(ns) - 5 // keep the top 5 bits: 1xxxx
	return (e+1)*16 + int(ns>>uint(e)&15)
}

func bucketValue(i int) float64 {
	if i < 16 {
		return float64(i)
	}
	e := i/16 - 1
	return float64(uint64(16+i%16) << uint(e))
}

func (h *histogram) record(d time.Duration) {
	h.buckets[bucketOf(uint64(max(d, 0)))].Add(1)
	h.n.Add(1)
}

func (h *histogram) count() int64 { return h.n.Load() }

// quantile returns the q-quantile in microseconds.
func (h *histogram) quantile(q float64) float64 {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	rank := int64(q*float64(n-1)) + 1
	var seen int64
	last := 0
	for i := range h.buckets {
		c := h.buckets[i].Load()
		if c == 0 {
			continue
		}
		seen += c
		last = i
		if seen >= rank {
			return bucketValue(i) / 1000
		}
	}
	return bucketValue(last) / 1000
}
