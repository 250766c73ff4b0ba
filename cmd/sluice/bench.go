package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
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

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addrs := fs.String("addr", "127.0.0.1:8081", "gRPC address(es) of the node(s) to load, comma-separated (callers spread over them)")
	conc := fs.Int("concurrency", 50, "concurrent callers")
	batch := fs.Int("batch", 1, "checks per call (1..1000)")
	keys := fs.Int("keys", 10_000, "distinct keys")
	sequential := fs.Bool("sequential", false, "take the keys in order (key:0, key:1, …, then again from key:0) instead of at random: with --calls keys/batch, every key once")
	name := fs.String("name", "bench", "limit name of every check (with --envoy: the key of every descriptor's entry)")
	envoy := fs.String("envoy", "", "call envoy.service.ratelimit.v3 ShouldRateLimit for this domain instead of Check: --batch descriptors per call, each {NAME: KEY}; the node's rules give the limit")
	limit := fs.Int64("limit", 1<<40, "limit of every key (the default admits everything)")
	window := fs.Duration("window", time.Minute, "window of every key")
	algorithm := fs.String("algorithm", "sliding_window", "algorithm of every key: sliding_window|sliding_log|token_bucket|leaky_bucket|fixed_window|gcra")
	duration := fs.Duration("duration", 10*time.Second, "how long to run (the run also stops after --calls)")
	maxCalls := fs.Int64("calls", 0, "stop after this many calls (0: only --duration)")
	every := fs.Duration("progress", time.Second, "progress line interval (0: none)")
	callTimeout := fs.Duration("timeout", 5*time.Second, "deadline of each call")
	asJSON := fs.Bool("json", false, "print the summary as JSON")
	conns := fs.Int("conns", 2, "gRPC connections per address (callers spread over them); with --owner-aware, one per member")
	ownerAware := fs.Bool("owner-aware", false, "learn the owner table from the nodes of --addr and send each check straight to its key's owner (transport.WithOwnerRouting) instead of to any node")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the load generator to this file")
	var sec clientFlags
	sec.register(fs, false)
	gcMinHeap := byteSize(DefaultGCMinHeap)
	fs.Var(&gcMinHeap, "gc-min-heap", "the load generator's garbage collector lets the heap grow to at least this size before it collects (as for serve); 0 turns the floor off")
	if err := parseWithEnv(fs, args); err != nil {
		return err
	}
	alg, err := bucket.ParseAlgorithm(*algorithm)
	if err != nil {
		return fmt.Errorf("--algorithm: %w", err)
	}
	switch {
	case *conc < 1 || *conc > 10_000:
		return fmt.Errorf("--concurrency %d: want 1..10000", *conc)
	case *batch < 1 || *batch > 1000:
		return fmt.Errorf("--batch %d: want 1..1000", *batch)
	case *conns < 1 || *conns > 1000:
		return fmt.Errorf("--conns %d: want 1..1000", *conns)
	case *keys < 1:
		return fmt.Errorf("--keys %d: want at least 1", *keys)
	case *duration <= 0 || *duration > 24*time.Hour:
		return fmt.Errorf("--duration %v: want a positive duration up to 24h", *duration)
	case *window < time.Millisecond:
		return fmt.Errorf("--window %v: want at least 1ms", *window)
	case *ownerAware && *envoy != "":
		return errors.New("--owner-aware routes the native Check API: it does not go with --envoy")
	case alg == bucket.SlidingLog && *limit > bucket.MaxLogLimit:
		return fmt.Errorf("--algorithm sliding_log keeps one timestamp per hit: give a --limit of at most %d", bucket.MaxLogLimit)
	}
	defer startGCFloor(uint64(gcMinHeap))()
	var clients []*transport.Client
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	list := strings.Split(*addrs, ",")
	opts, err := sec.dialOptions()
	if err != nil {
		return err
	}
	var owned *transport.ClusterClient
	if *ownerAware {
		trimmed := make([]string, len(list))
		for i, a := range list {
			trimmed[i] = strings.TrimSpace(a)
		}
		owned, err = transport.NewClient(trimmed, transport.WithDialOptions(opts...), transport.WithOwnerRouting(0))
		if err != nil {
			return err
		}
		defer owned.Close()
		rctx, rcancel := context.WithTimeout(ctx, *callTimeout)
		err = owned.RefreshOwners(rctx)
		rcancel()
		if err != nil {
			return fmt.Errorf("--owner-aware: %w", err)
		}
	} else {
		for range *conns {
			for _, a := range list {
				c, err := transport.Dial(strings.TrimSpace(a), opts...)
				if err != nil {
					return fmt.Errorf("%s: %w", a, err)
				}
				clients = append(clients, c)
			}
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	keyNames := make([]string, *keys)
	for i := range keyNames {
		keyNames[i] = fmt.Sprint("key:", i)
	}
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var (
		lat                                     histogram
		issued, checks, allowed, over, itemErrs atomic.Int64
		callErrs                                atomic.Int64
		firstErr                                atomic.Pointer[string]
		wg                                      sync.WaitGroup
		budget                                  = *maxCalls
		nextKey                                 atomic.Uint64
	)
	start := time.Now()
	for w := range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			tmpl := &sluicev1.RateLimitRequest{Name: *name, Hits: proto.Int64(1), Limit: *limit, WindowMs: window.Milliseconds(), Algorithm: sluicev1.Algorithm(alg)}
			var call benchCall
			switch {
			case owned != nil:
				call = benchCheck(owned.CheckProto, *batch, tmpl)
			case *envoy != "":
				call = benchEnvoy(rlsv3.NewRateLimitServiceClient(clients[w%len(clients)].Conn()), *envoy, *name, *batch)
			default:
				call = benchCheck(clients[w%len(clients)].Check, *batch, tmpl)
			}
			keys := make([]string, *batch)
			for runCtx.Err() == nil {
				if budget > 0 && issued.Add(1) > budget {
					return
				}
				for i := range keys {
					if *sequential {
						keys[i] = keyNames[(nextKey.Add(1)-1)%uint64(len(keyNames))]
					} else {
						keys[i] = keyNames[rng.IntN(len(keyNames))]
					}
				}
				t := time.Now()
				// Each call has its own deadline: the end of the run stops
				// new calls but does not cut off the ones in flight.
				cctx, ccancel := context.WithTimeout(ctx, *callTimeout)
				n, ok, overLimit, itemErr, err := call(cctx, keys)
				ccancel()
				d := time.Since(t)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					callErrs.Add(1)
					msg := err.Error()
					firstErr.CompareAndSwap(nil, &msg)
					continue
				}
				lat.record(d)
				checks.Add(n)
				allowed.Add(ok)
				over.Add(overLimit)
				if itemErr != "" {
					itemErrs.Add(n - ok - overLimit)
					firstErr.CompareAndSwap(nil, &itemErr)
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if *every > 0 && !*asJSON {
		t := time.NewTicker(*every)
		var lastChecks int64
		lastAt := start
	progress:
		for {
			select {
			case <-done:
				break progress
			case now := <-t.C:
				c := checks.Load()
				fmt.Fprintf(stdout, "%6.1fs  %9d checks  %9.0f checks/s  p50 %7.0fµs  p99 %7.0fµs  errors %d\n",
					now.Sub(start).Seconds(), c, float64(c-lastChecks)/now.Sub(lastAt).Seconds(),
					lat.quantile(0.50), lat.quantile(0.99), callErrs.Load()+itemErrs.Load())
				lastChecks, lastAt = c, now
			}
		}
		t.Stop()
	}
	<-done
	secs := time.Since(start).Seconds()
	res := benchResult{
		Addrs: list, Envoy: *envoy, Concurrency: *conc, Batch: *batch, Keys: *keys, Seconds: secs,
		Calls: lat.count(), Checks: checks.Load(), Allowed: allowed.Load(), Over: over.Load(),
		ItemErrors: itemErrs.Load(), CallErrors: callErrs.Load(),
		ChecksPerSec: float64(checks.Load()) / secs, CallsPerSec: float64(lat.count()) / secs,
		P50us: lat.quantile(0.50), P90us: lat.quantile(0.90), P99us: lat.quantile(0.99), MaxUs: lat.quantile(1),
	}
	if p := firstErr.Load(); p != nil {
		res.FirstError = *p
	}
	if owned != nil {
		st := owned.OwnerStats()
		res.OwnerAware, res.OwnerRouted, res.OwnerFallback, res.OwnerMoved = true, st.Routed, st.Fallback, st.Moved
	}
	if *asJSON {
		b, _ := json.Marshal(res)
		fmt.Fprintln(stdout, string(b))
	} else {
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
	if res.Calls == 0 {
		if res.FirstError != "" {
			return fmt.Errorf("no call succeeded: %s", res.FirstError)
		}
		return errors.New("no call succeeded")
	}
	return nil
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
