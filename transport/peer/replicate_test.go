package peer

// Tests of Replicate (chunks, sums, malformed batches, deadlines) and the
// fake peer and counters the peer tests share.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/keymove"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// fakePeer is a PeerHandler over a map: it installs what is newer and
// answers pulls from what it holds, recording every call.
type fakePeer struct {
	mu         sync.Mutex
	held       map[string]bucket.Counter // name + "\x00" + key
	replicates []replicateCall
	pulls      []pullCall
	block      chan struct{} // when set, both methods wait on it, ignoring ctx
}

type replicateCall struct {
	from    string
	handoff bool
	n       int
}

type pullCall struct {
	from    string
	addr    string // from_addr
	n       int
	release bool
	ttl     time.Duration
}

func (c pullCall) String() string {
	from := c.from
	if c.addr != "" {
		from += "@" + c.addr
	}
	return fmt.Sprintf("{%s %d %t %v}", from, c.n, c.release, c.ttl)
}

var _ PeerHandler = (*fakePeer)(nil)

func (h *fakePeer) Replicate(_ context.Context, from string, handoff bool, counters []bucket.Counter) (installed, stale int) {
	h.mu.Lock()
	h.replicates = append(h.replicates, replicateCall{from, handoff, len(counters)})
	block := h.block
	h.mu.Unlock()
	if block != nil {
		<-block
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		h.held = make(map[string]bucket.Counter)
	}
	for _, c := range counters {
		k := c.Name + "\x00" + c.Key
		if c.Version > h.held[k].Version {
			h.held[k] = c
			installed++
		} else {
			stale++
		}
	}
	return installed, stale
}

func (h *fakePeer) Pull(_ context.Context, from, fromAddr string, keys []bucket.Counter, release bool, ttl time.Duration, _ []keymove.PullAnswer) {
	h.mu.Lock()
	h.pulls = append(h.pulls, pullCall{from, fromAddr, len(keys), release, ttl})
	block := h.block
	h.mu.Unlock()
	if block != nil {
		<-block
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range keys {
		c := h.held[keys[i].Name+"\x00"+keys[i].Key]
		keys[i].State, keys[i].Version = c.State, c.Version
	}
}

func (h *fakePeer) replicateCalls() []replicateCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]replicateCall(nil), h.replicates...)
}

func (h *fakePeer) pullCalls() []pullCall {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]pullCall(nil), h.pulls...)
}

// counter is a valid sliding-window counter for key k whose Count is n.
func counter(k string, n int64, version uint64) bucket.Counter {
	return bucket.Counter{
		Name:    "api",
		Key:     k,
		State:   bucket.State{Algorithm: bucket.SlidingWindow, Start: 1_700_000_040_000_000_000, Count: n, Prev: 2, Expires: 1_700_000_160_000_000_000},
		Version: version,
	}
}

func counters(prefix string, n int, version uint64) []bucket.Counter {
	cs := make([]bucket.Counter, n)
	for i := range cs {
		cs[i] = counter(prefix+strconv.Itoa(i), int64(i%10), version)
	}
	return cs
}

// bigCounter holds a sliding log of 10 000 timestamps: about 80 KB encoded.
func bigCounter(t testing.TB, k string) bucket.Counter {
	t.Helper()
	var s bucket.State
	lim := bucket.Limit{Algorithm: bucket.SlidingLog, Limit: bucket.MaxLogLimit, WindowMS: 60_000}
	if d := bucket.Decide(&s, lim, bucket.MaxLogLimit, 1_700_000_000_000_000_000); d.Status != bucket.UnderLimit {
		t.Fatalf("sliding log refused its own limit: %+v", d)
	}
	if n := s.EncodedLen(); n < 80_000 {
		t.Fatalf("sliding log state of %d bytes, want about 80 KB", n)
	}
	return bucket.Counter{Name: "log", Key: k, State: s, Version: 7}
}

func startPeerServer(t testing.TB, h PeerHandler, edit ...func(*testConfig)) *testServer {
	t.Helper()
	return startServer(t, &fakeHandler{}, append([]func(*testConfig){func(c *testConfig) { c.Peer = h }}, edit...)...)
}

// rawPeer dials addr with the generated client, to send what PeerClient
// never would.
func rawPeer(t testing.TB, addr string) sluicev1.PeerClient {
	t.Helper()
	return sluicev1.NewPeerClient(dial(t, addr).Conn())
}

// lockedBuffer is a log destination the server's goroutines may write while
// the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *lockedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestReplicateChunksAndSums(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b", MaxCounters: 5000})
	defer pc.Close()
	ctx := testCtx(t)

	cs := counters("k", 12_000, 5)
	installed, stale, err := pc.Replicate(ctx, s.GRPCAddr(), true, cs)
	if err != nil || installed != 12_000 || stale != 0 {
		t.Fatalf("Replicate: %d installed, %d stale, %v; want 12000, 0, nil", installed, stale, err)
	}
	if got := fmt.Sprint(h.replicateCalls()); got != "[{b true 5000} {b true 5000} {b true 2000}]" {
		t.Fatalf("handler calls %s, want three from b, handoff, of 5000, 5000, 2000", got)
	}
	// The same versions again are stale; newer ones for half are installed.
	for i := range 6000 {
		cs[i].Version = 6
		cs[i].State.Count++
	}
	installed, stale, err = pc.Replicate(ctx, s.GRPCAddr(), false, cs)
	if err != nil || installed != 6000 || stale != 6000 {
		t.Fatalf("second Replicate: %d installed, %d stale, %v; want 6000, 6000, nil", installed, stale, err)
	}
	if calls := h.replicateCalls(); len(calls) != 6 || calls[5].handoff {
		t.Fatalf("handler calls %v, want three more, not handoffs", calls)
	}
	h.mu.Lock()
	got := h.held["api\x00k42"]
	h.mu.Unlock()
	if got != cs[42] {
		t.Fatalf("held %+v, want %+v", got, cs[42])
	}
	if installed, stale, err := pc.Replicate(ctx, s.GRPCAddr(), false, nil); installed != 0 || stale != 0 || err != nil {
		t.Fatalf("empty Replicate: %d, %d, %v", installed, stale, err)
	}
}

// Large states are chunked by size too, so no RPC nears the 4 MiB limit.
func TestReplicateChunksLargeStates(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	s := startPeerServer(t, h)
	pc := NewPeerClient(PeerConfig{NodeName: "b"})
	defer pc.Close()
	big := bigCounter(t, "x")
	cs := make([]bucket.Counter, 100)
	for i := range cs {
		cs[i] = big
		cs[i].Key = "k" + strconv.Itoa(i)
	}
	installed, stale, err := pc.Replicate(testCtx(t), s.GRPCAddr(), false, cs)
	if err != nil || installed != 100 || stale != 0 {
		t.Fatalf("Replicate of 100 large counters: %d installed, %d stale, %v", installed, stale, err)
	}
	calls := h.replicateCalls()
	if len(calls) < 4 {
		t.Fatalf("%d RPCs for 8 MB of counters, want at least 4", len(calls))
	}
	for _, c := range calls {
		if c.n*big.State.EncodedLen() > maxChunkBytes {
			t.Fatalf("an RPC carried %d counters of %d bytes", c.n, big.State.EncodedLen())
		}
	}
}

// Malformed counters are refused, counted and logged once per call; the
// others are installed and the server keeps serving.
func TestReplicateRefusesMalformed(t *testing.T) {
	t.Parallel()
	h := &fakePeer{}
	var logs lockedBuffer
	s := startPeerServer(t, h, func(c *testConfig) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	raw := rawPeer(t, s.GRPCAddr())
	ctx := testCtx(t)

	good := counters("g", 3, 1)
	badState := CounterToProto(counter("bad", 1, 1))
	badState.State = badState.State[:10]
	noName := CounterToProto(counter("noname", 1, 1))
	noName.Name = ""
	nul := CounterToProto(counter("nul", 1, 1))
	nul.Name = "a\x00b"
	unversioned := CounterToProto(counter("v0", 1, 1))
	unversioned.Version = 0
	req := &sluicev1.ReplicateRequest{From: "node-c", Counters: []*sluicev1.Counter{
		CounterToProto(good[0]), badState, CounterToProto(good[1]), noName, nul, unversioned, CounterToProto(good[2]),
	}}
	resp, err := raw.Replicate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Installed != 3 || resp.Stale != 0 || resp.Refused != 4 {
		t.Fatalf("answer %v, want 3 installed, 4 refused", resp)
	}
	if got := fmt.Sprint(h.replicateCalls()); got != "[{node-c false 3}]" {
		t.Fatalf("handler calls %s, want one of the 3 valid counters", got)
	}
	out := logs.String()
	if n := strings.Count(out, "refused malformed counters"); n != 1 {
		t.Fatalf("%d log lines for one call, want 1:\n%s", n, out)
	}
	for _, want := range []string{"from=node-c", "refused=4", "index=1", "bad counter state"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}

	// The server keeps serving, and PeerClient reports refusals as errors.
	pc := NewPeerClient(PeerConfig{NodeName: "b"})
	defer pc.Close()
	cs := counters("h", 3, 1)
	cs[1].Name = ""
	installed, stale, err := pc.Replicate(ctx, s.GRPCAddr(), false, cs)
	if err == nil || !strings.Contains(err.Error(), "refused 1 of 3") || installed != 2 || stale != 0 {
		t.Fatalf("Replicate with an empty name: %d installed, %d stale, %v; want 2, 0 and a refusal error", installed, stale, err)
	}

	// Too many counters, or an unknown kind, refuse the call.
	many := &sluicev1.ReplicateRequest{Counters: make([]*sluicev1.Counter, MaxCounters+1)}
	for i := range many.Counters {
		many.Counters[i] = &sluicev1.Counter{}
	}
	if _, err := raw.Replicate(ctx, many); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("%d counters: %v, want InvalidArgument", len(many.Counters), err)
	}
	if _, err := raw.Replicate(ctx, &sluicev1.ReplicateRequest{Kind: 7}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unknown kind: %v, want InvalidArgument", err)
	}
}

func TestReplicatePullUnimplementedWithoutPeer(t *testing.T) {
	t.Parallel()
	s := startServer(t, &fakeHandler{})
	pc := NewPeerClient(PeerConfig{NodeName: "b"})
	defer pc.Close()
	ctx := testCtx(t)
	if _, _, err := pc.Replicate(ctx, s.GRPCAddr(), false, counters("k", 1, 1)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Replicate: %v, want Unimplemented", err)
	}
	if err := pc.Pull(ctx, s.GRPCAddr(), []bucket.Counter{{Name: "a", Key: "k"}}, false, 0, make([]keymove.PullAnswer, 1)); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Pull: %v, want Unimplemented", err)
	}
	if err := pc.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := pc.Replicate(ctx, s.GRPCAddr(), false, counters("k", 1, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Replicate after Close: %v, want ErrClosed", err)
	}
	if err := pc.Pull(ctx, s.GRPCAddr(), []bucket.Counter{{Name: "a", Key: "k"}}, false, 0, make([]keymove.PullAnswer, 1)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pull after Close: %v, want ErrClosed", err)
	}
}

// A hanging handler costs Replicate and Pull their deadline, no more: the
// context's when it has one, else BulkTimeout or Timeout.
func TestReplicatePullDeadline(t *testing.T) {
	t.Parallel()
	h := &fakePeer{block: make(chan struct{})}
	s := startPeerServer(t, h)
	t.Cleanup(func() { close(h.block) }) // runs before the server's Shutdown
	addr := s.GRPCAddr()
	const short = 100 * time.Millisecond
	tests := []struct {
		name string
		pc   PeerConfig
		ctx  time.Duration // 0: no deadline
		call func(ctx context.Context, pc *PeerClient) error
	}{
		{"replicate/bulk timeout", PeerConfig{Timeout: time.Hour, BulkTimeout: short}, 0, func(ctx context.Context, pc *PeerClient) error {
			_, _, err := pc.Replicate(ctx, addr, true, counters("k", 3, 1))
			return err
		}},
		{"replicate/ctx deadline", PeerConfig{Timeout: time.Millisecond, BulkTimeout: time.Hour}, short, func(ctx context.Context, pc *PeerClient) error {
			_, _, err := pc.Replicate(ctx, addr, true, counters("k", 3, 1))
			return err
		}},
		{"pull/timeout", PeerConfig{Timeout: short, BulkTimeout: time.Hour}, 0, func(ctx context.Context, pc *PeerClient) error {
			return pc.Pull(ctx, addr, []bucket.Counter{{Name: "a", Key: "k"}}, true, time.Second, make([]keymove.PullAnswer, 1))
		}},
		{"pull/ctx deadline", PeerConfig{Timeout: time.Millisecond, BulkTimeout: time.Millisecond}, short, func(ctx context.Context, pc *PeerClient) error {
			return pc.Pull(ctx, addr, []bucket.Counter{{Name: "a", Key: "k"}}, true, time.Second, make([]keymove.PullAnswer, 1))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pc := NewPeerClient(tt.pc)
			defer pc.Close()
			// Timed from before the context's deadline is set: CI saw
			// 99.98 ms "before the deadline of 100ms" when start came after.
			start := time.Now()
			ctx := context.Background()
			if tt.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctx)
				defer cancel()
			}
			done := make(chan error, 1)
			go func() { done <- tt.call(ctx, pc) }()
			select {
			case err := <-done:
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%v, want DeadlineExceeded", err)
				}
				if d := time.Since(start); d < short {
					t.Fatalf("gave up after %v, before the deadline of %v", d, short)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("still waiting for a hanging peer after 30 s")
			}
		})
	}
}
