package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/rules"
)

// allowAll allows every valid check; it counts the checks it saw and
// remembers the client addresses they came from.
type allowAll struct {
	checks atomic.Int64
	mu     sync.Mutex
	from   map[string]bool
}

func (h *allowAll) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	h.checks.Add(int64(len(reqs)))
	if p, ok := peer.FromContext(ctx); ok {
		h.mu.Lock()
		h.from[p.Addr.String()] = true
		h.mu.Unlock()
	}
	for i := range reqs {
		if err := reqs[i].Validate(); err != nil {
			out[i] = check.Outcome{Err: err.Error()}
			continue
		}
		out[i] = check.Outcome{Decision: bucket.Decision{Status: bucket.UnderLimit, Limit: reqs[i].Limit.Limit}, Owner: "n1"}
	}
}

func (h *allowAll) CheckStandIn(ctx context.Context, _ string, reqs []check.Request, _ []string, out []check.Outcome, _ []string) {
	h.Check(ctx, reqs, out)
}

func (h *allowAll) CheckForwarded(ctx context.Context, _ string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.Check(ctx, reqs, out)
}

func startBenchServer(t *testing.T, h transport.Handler) string {
	t.Helper()
	return startBenchServerWith(t, h, nil)
}

// startBenchServerWith is startBenchServer with the owner table owners
// makes for the server's address (nil: none).
func startBenchServerWith(t *testing.T, h transport.Handler, owners func(addr string) transport.OwnerSource) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := transport.ServerConfig{GRPCListener: l, Handler: h}
	if owners != nil {
		cfg.Owners = owners(l.Addr().String())
	}
	s, err := transport.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s.GRPCAddr()
}

// runBenchJSON runs bench with args, --json and no heap floor (GOGC is
// the process's: it is left to the other tests), and returns its summary.
func runBenchJSON(t *testing.T, args ...string) benchResult {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := bench(context.Background(), append(args, "--json", "--gc-min-heap", "0"), &out, &errOut); err != nil {
		t.Fatalf("bench: %v (%s)", err, errOut.String())
	}
	var res benchResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("summary %q: %v", out.String(), err)
	}
	return res
}

// TestBenchSpreadsCallersOverConnections runs a bounded bench (--calls) over
// several connections and checks its summary against what the server saw.
func TestBenchSpreadsCallersOverConnections(t *testing.T) {
	t.Parallel()
	h := &allowAll{from: map[string]bool{}}
	addr := startBenchServer(t, h)
	res := runBenchJSON(t,
		"--addr", addr, "--conns", "3", "--concurrency", "6", "--batch", "4", "--keys", "10",
		"--calls", "60", "--duration", "20s")
	if res.Calls != 60 || res.Checks != 240 || res.Allowed != 240 || res.CallErrors != 0 || res.ItemErrors != 0 {
		t.Errorf("summary %+v; want 60 calls of 4 allowed checks, no errors", res)
	}
	if got := h.checks.Load(); got != 240 {
		t.Errorf("server saw %d checks, want 240", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.from) != 3 {
		t.Errorf("calls came over %d connections %v, want 3", len(h.from), h.from)
	}
}

// oneOwner is the owner table of a one-node cluster: node n1 (allowAll's
// name) at addr owns every partition.
type oneOwner struct{ addr string }

func (o oneOwner) Owners(context.Context) (*sluicev1.OwnersResponse, error) {
	return &sluicev1.OwnersResponse{Node: "n1", Ready: true, Version: 1, Hash: client.OwnerHash, Partitions: 7,
		Members: []*sluicev1.OwnerMember{{Name: "n1", GrpcAddr: o.addr}}, Owners: make([]uint32, 7)}, nil
}

func TestBenchOwnerAware(t *testing.T) {
	t.Parallel()
	h := &allowAll{from: map[string]bool{}}
	addr := startBenchServerWith(t, h, func(a string) transport.OwnerSource { return oneOwner{a} })
	res := runBenchJSON(t,
		"--addr", addr, "--owner-aware", "--concurrency", "4", "--keys", "10",
		"--calls", "40", "--duration", "20s")
	if !res.OwnerAware || res.Checks != 40 || res.OwnerRouted != 40 || res.OwnerFallback != 0 || res.OwnerMoved != 0 || res.CallErrors != 0 {
		t.Errorf("summary %+v; want 40 checks, all routed to their owner", res)
	}
	if got := h.checks.Load(); got != 40 {
		t.Errorf("server saw %d checks, want 40", got)
	}

	// A node that serves no owner table: the run is refused, saying why.
	plain := startBenchServer(t, &allowAll{from: map[string]bool{}})
	var out, errOut bytes.Buffer
	err := bench(context.Background(), []string{"--addr", plain, "--owner-aware", "--calls", "1", "--gc-min-heap", "0"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--owner-aware") || !strings.Contains(err.Error(), "not available") {
		t.Errorf("--owner-aware against a node without an owner table: %v", err)
	}
	err = bench(context.Background(), []string{"--addr", addr, "--owner-aware", "--envoy", "d"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--envoy") {
		t.Errorf("--owner-aware with --envoy: %v, want refused", err)
	}
}

// twoOwners is the owner table of two members, n0 and n1, placing the 7
// partitions in turn; addrs are set once both servers listen.
type twoOwners struct{ addrs [2]string }

func (o *twoOwners) Owners(context.Context) (*sluicev1.OwnersResponse, error) {
	r := &sluicev1.OwnersResponse{Node: "n0", Ready: true, Version: 1, Hash: client.OwnerHash, Partitions: 7}
	for i, a := range o.addrs {
		r.Members = append(r.Members, &sluicev1.OwnerMember{Name: fmt.Sprint("n", i), GrpcAddr: a})
	}
	for p := range 7 {
		r.Owners = append(r.Owners, uint32(p%2))
	}
	return r, nil
}

// ownedBy is allowAll for member me of twoOwners: it counts the calls and
// the items whose key the table gives to the other member.
type ownedBy struct {
	allowAll
	me           uint32
	calls, stray atomic.Int64
}

func (h *ownedBy) Check(ctx context.Context, reqs []check.Request, out []check.Outcome) {
	h.calls.Add(1)
	for _, r := range reqs {
		if uint32(client.OwnerKeyHash(r.Name, r.Key)%7%2) != h.me {
			h.stray.Add(1)
		}
	}
	h.allowAll.Check(ctx, reqs, out)
}

// With --owner-batches, every batch holds keys of one owner: a call per
// batch, each to the owner of all its keys.
func TestBenchOwnerBatches(t *testing.T) {
	t.Parallel()
	tbl := &twoOwners{}
	hs := []*ownedBy{{allowAll: allowAll{from: map[string]bool{}}, me: 0}, {allowAll: allowAll{from: map[string]bool{}}, me: 1}}
	for i, h := range hs {
		tbl.addrs[i] = startBenchServerWith(t, h, func(string) transport.OwnerSource { return tbl })
	}
	const calls, batch = 40, 8
	res := runBenchJSON(t, "--addr", tbl.addrs[0], "--owner-aware", "--owner-batches", "--concurrency", "4", "--keys", "100",
		"--batch", fmt.Sprint(batch), "--calls", fmt.Sprint(calls), "--duration", "20s")
	if res.Checks != calls*batch || res.OwnerRouted != calls*batch || res.CallErrors != 0 {
		t.Errorf("summary %+v; want %d checks, all routed to their owner", res, calls*batch)
	}
	var got int64
	for _, h := range hs {
		got += h.calls.Load()
		if h.calls.Load() == 0 || h.stray.Load() != 0 {
			t.Errorf("n%d: %d calls, %d checks of the other member's keys; want some calls, none of those", h.me, h.calls.Load(), h.stray.Load())
		}
	}
	if got != calls {
		t.Errorf("the members got %d calls for %d batches: batches were split", got, calls)
	}
	var out, errOut bytes.Buffer
	for _, args := range [][]string{{"--owner-batches"}, {"--owner-aware", "--owner-batches", "--sequential"}} {
		err := bench(context.Background(), append([]string{"--addr", tbl.addrs[0]}, args...), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "--owner-batches") {
			t.Errorf("%v: %v, want refused", args, err)
		}
	}
}

func TestBenchRefusesBadConns(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"0", "1001"} {
		var out, errOut bytes.Buffer
		err := bench(context.Background(), []string{"--addr", "127.0.0.1:1", "--conns", n}, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "--conns") {
			t.Errorf("--conns %s: err %v, want a --conns error", n, err)
		}
	}
}

// overOnZero refuses the checks whose key ends in "0" and allows the rest,
// counting both; it remembers the names and keys it saw.
type overOnZero struct {
	allowed, over atomic.Int64
	mu            sync.Mutex
	seen          map[string]bool // name + " " + key
}

func (h *overOnZero) Check(_ context.Context, reqs []check.Request, out []check.Outcome) {
	for i := range reqs {
		h.mu.Lock()
		h.seen[reqs[i].Name+" "+reqs[i].Key] = true
		h.mu.Unlock()
		st := bucket.UnderLimit
		if strings.HasSuffix(reqs[i].Key, "0") {
			st = bucket.OverLimit
			h.over.Add(1)
		} else {
			h.allowed.Add(1)
		}
		out[i] = check.Outcome{Decision: bucket.Decision{Status: st, Limit: reqs[i].Limit.Limit}, Owner: "n1"}
	}
}

func (h *overOnZero) CheckStandIn(ctx context.Context, _ string, reqs []check.Request, _ []string, out []check.Outcome, _ []string) {
	h.Check(ctx, reqs, out)
}

func (h *overOnZero) CheckForwarded(ctx context.Context, _ string, reqs []check.Request, out []check.Outcome, _ []string) {
	h.Check(ctx, reqs, out)
}

// edgeRule gives every descriptor of domain "edge" one hourly limit.
type edgeRule struct{}

func (edgeRule) MatchEnvoy(domain string, _ []rules.EnvoyEntry) transport.EnvoyMatch {
	if domain != "edge" {
		return transport.EnvoyMatch{}
	}
	return transport.EnvoyMatch{Known: true, Name: "envoy:edge", Found: true, Rule: rules.EnvoyRule{
		Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 1000, WindowMS: 3_600_000},
		Unit:  rules.UnitHour,
	}}
}

// TestBenchEnvoy runs a bounded bench of ShouldRateLimit calls and checks
// that every descriptor became the check of its key in the domain, and
// that the summary counts what the server decided.
func TestBenchEnvoy(t *testing.T) {
	t.Parallel()
	h := &overOnZero{seen: map[string]bool{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := transport.NewServer(transport.ServerConfig{GRPCListener: l, Handler: h, Envoy: transport.EnvoyConfig{Rules: edgeRule{}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	res := runBenchJSON(t,
		"--addr", s.GRPCAddr(), "--envoy", "edge", "--name", "user", "--concurrency", "4", "--batch", "5",
		"--keys", "20", "--calls", "50", "--duration", "20s")
	if res.Envoy != "edge" || res.Calls != 50 || res.Checks != 250 || res.CallErrors != 0 || res.ItemErrors != 0 {
		t.Errorf("summary %+v; want 50 calls of 5 descriptors in domain edge, no errors", res)
	}
	if res.Allowed != h.allowed.Load() || res.Over != h.over.Load() || res.Over == 0 || res.Allowed == 0 {
		t.Errorf("bench counted %d allowed and %d over; the server decided %d and %d", res.Allowed, res.Over, h.allowed.Load(), h.over.Load())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.seen {
		var n int
		if _, err := fmt.Sscanf(k, "envoy:edge user=key:%d", &n); err != nil || n < 0 || n >= 20 {
			t.Errorf("the server saw check %q, want envoy:edge user=key:N with N < 20", k)
		}
	}
}
