package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"

	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/security"
)

// Defaults of PeerConfig.
const (
	// DefaultForwardTimeout bounds each forward when the caller's context has
	// no earlier deadline: far above a loopback or same-zone round trip
	// (tens to hundreds of µs), short enough that an unreachable owner costs
	// a check a quarter of a second, not a hang.
	DefaultForwardTimeout = 250 * time.Millisecond
	// PeerAckTimeout is the shortest time a peer connection may hold sent
	// data that its peer has not acknowledged before it is dropped and
	// redialled (TCP_USER_TIMEOUT); the PeerClient uses 4 forward
	// timeouts when that is longer: a peer that acknowledges nothing for
	// that long answers no forward on that connection.
	PeerAckTimeout = time.Second
	// PeerKeepaliveTime is how long a peer connection with calls pending
	// may be silent before the client pings it (gRPC's minimum is 10 s).
	PeerKeepaliveTime = 10 * time.Second
	// DefaultMaxInFlight is how many batches may be on the wire to one peer
	// at once. One batch per peer gives the fewest RPCs when the peer
	// answers at once (BenchmarkForwardParallel on the stream, 2026-11-29:
	// 10.4–12.9 µs of CPU and 0.26 RPCs per forward at 1, 12.3–13.1 µs and
	// 0.72 at 4), but a peer that answers late holds every forward queued
	// behind its one batch for a second round trip: at a CPU quota, nodes
	// throttled for most of each period, forwards timed out and were stood
	// in for. In sidecar capacity rounds of 8 nodes at 0.2 core
	// (test/capacity.sh, 2026-11-29), 4 in flight answered 148,000–164,000
	// checks/s with 535–1,852 stand-ins, against 102,000–120,000 and
	// 12,770–23,181 at 1.
	DefaultMaxInFlight = 4
	// DefaultMaxCounters is the most counters (or keys) PeerClient puts in
	// one Replicate or Pull RPC: with small states a few hundred KiB, well
	// under the receiver's 4 MiB message limit.
	DefaultMaxCounters = 5000
	// DefaultBulkTimeout bounds a Replicate when the caller's context has no
	// deadline: a handoff may carry many counters.
	DefaultBulkTimeout = 10 * time.Second
)

// ErrClosed is returned by Forward, Replicate and Pull after Close.
var ErrClosed = errors.New("transport: peer client closed")

// PeerConfig configures a PeerClient.
type PeerConfig struct {
	// NodeName is this node's name, sent as ForwardRequest.from.
	NodeName string
	// NodeAddr is this node's advertised gRPC address, sent as
	// PullRequest.from_addr: where the keys a pull releases go. Empty, the
	// receiver looks it up by NodeName among the members it knows.
	NodeAddr string
	// ClusterName is sent with every call (ForwardRequest.cluster, …); a
	// receiver whose transport.ServerConfig.ClusterName differs refuses the
	// call.
	ClusterName string
	// Timeout bounds each Forward when ctx has no earlier deadline;
	// 0 means DefaultForwardTimeout (250 ms).
	Timeout time.Duration
	// MaxBatch is the most items in one Forward RPC; 0 or more than
	// check.MaxBatchSize means check.MaxBatchSize (the receiver's limit).
	MaxBatch int
	// MaxInFlight is the most Forward RPCs on the wire to one peer at once;
	// 0 means DefaultMaxInFlight.
	MaxInFlight int
	// MaxCounters is the most counters in one Replicate RPC and keys in one
	// Pull RPC; 0 means DefaultMaxCounters (5000), more than MaxCounters
	// (the receiver's limit, 100 000) means MaxCounters.
	MaxCounters int
	// BulkTimeout bounds a whole Replicate call when ctx has no deadline;
	// 0 means DefaultBulkTimeout (10 s). A Pull without a deadline is
	// bounded by Timeout, like a Forward.
	BulkTimeout time.Duration
	// TLS, when set, makes every connection to a peer TLS: it presents the
	// node's certificate and accepts peers whose certificate chains to the
	// node CA.
	TLS *security.TLS
	// Prover, when set and TLS is not, signs every call with a proof of
	// cluster membership (the receiver's transport.ServerConfig.Prover
	// checks it).
	Prover *security.Prover
	// DialOptions are added after the defaults (insecure transport
	// credentials, StreamWindowSize and ConnWindowSize, reconnect backoff of
	// at most 1 s), so they override them:
	// pass grpc.WithTransportCredentials for TLS.
	DialOptions []grpc.DialOption
	// Tracing, when set, traces the RPCs made in a traced context and
	// carries the trace on them (a *transport.Tracing); nil, or one whose
	// ClientHandler is nil, installs nothing.
	Tracing ClientTracing
	// UnaryForwards makes every forward its own unary Peer/Forward call,
	// as before forwards were streamed (Peer/Forwards, one stream per
	// peer): for comparison, and for peers whose proxies do not carry
	// long-lived streams. A peer that does not serve Forwards gets unary
	// calls without it.
	UnaryForwards bool
}

// ClientTracing traces the RPCs a PeerClient makes in a traced context
// (PeerConfig.Tracing). transport.Tracing implements it; this package
// declares it rather than import the package of the public API.
type ClientTracing interface {
	// ClientHandler is the gRPC stats handler of the client's connections;
	// nil traces nothing.
	ClientHandler() stats.Handler
}

// PeerClient forwards checks to the nodes that own their keys over the
// internal sluice.v1.Peer/Forward RPC, and replicates and pulls counters
// (Peer/Replicate, Peer/Pull). It keeps one grpc.ClientConn per peer
// address, made on first use and kept until ClosePeer or Close.
//
// Forwards to one peer are batched without a timer: when fewer than
// MaxInFlight batches are on the wire to that peer, a Forward is sent at once
// on the caller's goroutine; otherwise it joins a queue, and the next batch to
// finish sends everything queued (up to MaxBatch items) as one RPC. So a lone
// caller pays one round trip and nothing more, and under load the RPC count
// grows with the round trip time, not with the number of callers.
//
// A PeerClient is safe for concurrent use.
type PeerClient struct {
	name        string
	addr        string // PullRequest.from_addr
	cluster     string
	timeout     time.Duration
	maxBatch    int
	maxInFlight int
	maxCounters int
	bulkTimeout time.Duration
	dialOpts    []grpc.DialOption
	traced      bool // Tracing set: queued forwards keep their caller's span
	// unaryForwards: every forward is a unary Forward call (PeerConfig).
	unaryForwards bool
	prover        *security.Prover // proves Forwards envelopes (no TLS, a gossip key)
	replyChans    sync.Pool        // chan *sluicev1.ForwardReply, capacity 1

	ctx    context.Context // parent of queued batches' RPCs; canceled by Close
	cancel context.CancelFunc

	peers   sync.Map   // addr → *peer
	mu      sync.Mutex // serialises making and dropping peers, and closed
	closed  bool
	calls   sync.Pool // *call
	batches sync.Pool // *batch
}

// NewPeerClient returns a PeerClient. It dials nothing until the first Forward
// to an address.
func NewPeerClient(cfg PeerConfig) *PeerClient {
	pc := &PeerClient{
		name:        cfg.NodeName,
		addr:        cfg.NodeAddr,
		cluster:     cfg.ClusterName,
		timeout:     cfg.Timeout,
		maxBatch:    cfg.MaxBatch,
		maxInFlight: cfg.MaxInFlight,
		maxCounters: cfg.MaxCounters,
		bulkTimeout: cfg.BulkTimeout,
	}
	if pc.timeout <= 0 {
		pc.timeout = DefaultForwardTimeout
	}
	if pc.maxBatch <= 0 || pc.maxBatch > check.MaxBatchSize {
		pc.maxBatch = check.MaxBatchSize
	}
	if pc.maxInFlight <= 0 {
		pc.maxInFlight = DefaultMaxInFlight
	}
	if pc.maxCounters <= 0 {
		pc.maxCounters = DefaultMaxCounters
	}
	pc.maxCounters = min(pc.maxCounters, MaxCounters)
	if pc.bulkTimeout <= 0 {
		pc.bulkTimeout = DefaultBulkTimeout
	}
	pc.dialOpts = []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(StreamWindowSize),
		grpc.WithInitialConnWindowSize(ConnWindowSize),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
		// A connection whose sent data goes unacknowledged for
		// PeerAckTimeout is dropped (grpc sets TCP_USER_TIMEOUT to the
		// keepalive timeout) and redialled within the backoff above.
		// Without it, a connection that lost packets for a while (one-way
		// loss, a flapping link) sits in TCP's exponential retransmission
		// backoff, its next retransmission up to tens of seconds away, and
		// every forward on it times out long after the link is back.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: PeerKeepaliveTime, Timeout: max(PeerAckTimeout, 4*pc.timeout)}),
	}
	switch {
	case cfg.TLS != nil:
		pc.dialOpts = append(pc.dialOpts, grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS.PeerClientConfig())))
	case cfg.Prover != nil:
		pc.dialOpts = append(pc.dialOpts, security.WithProofs(cfg.Prover), security.WithStreamProofs(cfg.Prover))
		pc.prover = cfg.Prover
	}
	pc.unaryForwards = cfg.UnaryForwards
	if cfg.Tracing != nil {
		if h := cfg.Tracing.ClientHandler(); h != nil {
			pc.dialOpts = append(pc.dialOpts, grpc.WithStatsHandler(h))
			pc.traced = true
		}
	}
	pc.dialOpts = append(pc.dialOpts, cfg.DialOptions...)
	pc.ctx, pc.cancel = context.WithCancel(context.Background())
	pc.calls.New = func() any { return &call{done: make(chan error, 1)} }
	pc.batches.New = func() any { return new(batch) }
	pc.replyChans.New = func() any { return make(chan *sluicev1.ForwardReply, 1) }
	return pc
}

// Forward asks the node at addr to decide reqs (CheckForwarded there) and
// fills out with its answers, in order, and movedTo (as long as reqs): an
// item whose key that node has handed to another comes back undecided with
// movedTo[i] the other node's address, "" for the decided items. It returns
// an error, and leaves out and movedTo unspecified, when the peer could not
// answer: the wrapped gRPC error, or ctx.Err() (context.DeadlineExceeded
// also when Timeout ran out). It never waits past min(ctx's deadline,
// now+Timeout), but for a send to a wedged peer on the Forwards stream,
// which ends within sendGrace (1 ms) after (forwards_client.go).
//
// Once the connection to addr is up, forwards travel as envelopes on one
// Peer/Forwards stream (unless PeerConfig.UnaryForwards, or the call is
// traced, or the peer does not serve the stream); before, as unary
// Peer/Forward calls.
func (pc *PeerClient) Forward(ctx context.Context, addr string, reqs []check.Request, out []check.Outcome, movedTo []string) error {
	return pc.chunked(ctx, addr, reqs, nil, out, movedTo, func(ctx context.Context, p *peer, reqs []check.Request, _ []string, out []check.Outcome, movedTo []string) error {
		if err := p.forward(ctx, reqs, out, movedTo); err != nil {
			return fmt.Errorf("transport: forward %d requests to %s: %w", len(reqs), addr, err)
		}
		return nil
	})
}

// ForwardStandIn asks the node at addr to decide reqs although it may not
// own their keys, because their owner did not answer (CheckStandIn there).
// pullFrom is nil or names, per request, the node to pull its key from
// first ("" for none). It is sent at once, in one RPC per MaxBatch items,
// outside the batching of Forward: stand-ins are rare. Answers and errors
// are as for Forward.
func (pc *PeerClient) ForwardStandIn(ctx context.Context, addr string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
	return pc.chunked(ctx, addr, reqs, pullFrom, out, movedTo, func(ctx context.Context, p *peer, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
		return p.forwardStandIn(ctx, reqs, pullFrom, out, movedTo)
	})
}

// chunked checks the lengths of the slices, finds the peer at addr and
// calls send on chunks of at most MaxBatch items under one deadline (ctx's,
// or now+Timeout when that is sooner). pullFrom may be nil.
func (pc *PeerClient) chunked(ctx context.Context, addr string, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string,
	send func(ctx context.Context, p *peer, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error) error {
	if len(reqs) != len(out) || len(reqs) != len(movedTo) {
		return fmt.Errorf("transport: forward: %d requests but %d outcomes and %d moved-to entries", len(reqs), len(out), len(movedTo))
	}
	if pullFrom != nil && len(pullFrom) != len(reqs) {
		return fmt.Errorf("transport: forward: %d requests but %d pull-from entries", len(reqs), len(pullFrom))
	}
	if len(reqs) == 0 {
		return nil
	}
	p, err := pc.peer(addr)
	if err != nil {
		return err
	}
	ctx, cancel := pc.withDeadline(ctx)
	defer cancel()
	for start := 0; start < len(reqs); start += pc.maxBatch {
		end := min(start+pc.maxBatch, len(reqs))
		var pf []string
		if pullFrom != nil {
			pf = pullFrom[start:end]
		}
		if err := send(ctx, p, reqs[start:end], pf, out[start:end], movedTo[start:end]); err != nil {
			return err
		}
	}
	return nil
}

// forwardStandIn sends one chunk as a stand-in Forward RPC.
func (p *peer) forwardStandIn(ctx context.Context, reqs []check.Request, pullFrom []string, out []check.Outcome, movedTo []string) error {
	req := &sluicev1.ForwardRequest{From: p.pc.name, Cluster: p.pc.cluster, StandIn: true, Requests: make([]*sluicev1.RateLimitRequest, 0, len(reqs))}
	for i := range reqs {
		req.Requests = append(req.Requests, RequestToProto(reqs[i]))
	}
	if slices.ContainsFunc(pullFrom, func(a string) bool { return a != "" }) {
		req.PullFrom = pullFrom
	}
	resp, err := p.client.Forward(ctx, req)
	if err != nil {
		return fmt.Errorf("transport: stand-in forward of %d requests to %s: %w", len(reqs), p.addr, err)
	}
	if len(resp.GetResponses()) != len(reqs) {
		return fmt.Errorf("transport: %s answered %d of %d stand-in requests", p.addr, len(resp.GetResponses()), len(reqs))
	}
	if err := checkMoved(resp, len(reqs)); err != nil {
		return fmt.Errorf("transport: %s: %w", p.addr, err)
	}
	mv := resp.GetMovedTo()
	for i, r := range resp.GetResponses() {
		out[i] = OutcomeFromProto(r)
		movedTo[i] = ""
		if len(mv) > 0 {
			movedTo[i] = mv[i]
		}
	}
	return nil
}

func noop() {}

// withDeadline gives ctx a deadline no later than now+timeout.
func (pc *PeerClient) withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	d := time.Now().Add(pc.timeout)
	if dl, ok := ctx.Deadline(); ok && !dl.After(d) {
		return ctx, noop
	}
	return context.WithDeadline(ctx, d)
}

// peer returns the peer for addr, making it (and its lazy ClientConn) on
// first use.
func (pc *PeerClient) peer(addr string) (*peer, error) {
	if v, ok := pc.peers.Load(addr); ok {
		return v.(*peer), nil
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closed {
		return nil, ErrClosed
	}
	if v, ok := pc.peers.Load(addr); ok {
		return v.(*peer), nil
	}
	if addr == "" {
		return nil, errors.New("transport: empty peer address")
	}
	conn, err := grpc.NewClient(addr, pc.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("transport: peer %s: %w", addr, err)
	}
	p := &peer{pc: pc, addr: addr, conn: conn, client: sluicev1.NewPeerClient(conn)}
	p.idle = sync.NewCond(&p.mu)
	pc.peers.Store(addr, p)
	return p, nil
}

// Status asks the node at addr for its own status (Admin.Status) on the
// connection forwards use, signed or authenticated like the other internal
// calls; the status page asks each member this way. It never waits past
// min(ctx's deadline, now+Timeout).
func (pc *PeerClient) Status(ctx context.Context, addr string) (*sluicev1.StatusResponse, error) {
	p, err := pc.peer(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := pc.withDeadline(ctx)
	defer cancel()
	return sluicev1.NewAdminClient(p.conn).Status(ctx, &sluicev1.StatusRequest{})
}

// ClosePeer closes the connection to addr (a member that left). Forwards in
// progress to it fail; a later Forward to addr dials again.
func (pc *PeerClient) ClosePeer(addr string) error {
	pc.mu.Lock()
	v, ok := pc.peers.LoadAndDelete(addr)
	pc.mu.Unlock()
	if !ok {
		return nil
	}
	return v.(*peer).close()
}

// ResetBackoff makes the connection to addr, if any, try to reconnect at
// once instead of waiting out gRPC's reconnect backoff: the node at addr has
// come back. Calls in progress are not disturbed. A connection in transient
// failure is closed instead (the next call dials afresh): gRPC fails every
// call on it with the last dial's error until a new dial succeeds, so a
// node that restarted on the same address was refused for up to the
// backoff after it was back (TestResetBackoffAfterRestart), and the checks
// forwarded to it went to stand-ins.
func (pc *PeerClient) ResetBackoff(addr string) {
	v, ok := pc.peers.Load(addr)
	if !ok {
		return
	}
	p := v.(*peer)
	if p.conn.GetState() != connectivity.TransientFailure {
		p.conn.ResetConnectBackoff()
		return
	}
	pc.mu.Lock()
	dropped := pc.peers.CompareAndDelete(addr, v)
	pc.mu.Unlock()
	if dropped {
		p.close() // its calls fail at once in transient failure
	}
}

// Close closes every connection, fails the forwards in progress and waits
// until no batch is on the wire. Forward after Close returns ErrClosed.
func (pc *PeerClient) Close() error {
	pc.mu.Lock()
	if pc.closed {
		pc.mu.Unlock()
		return nil
	}
	pc.closed = true
	var ps []*peer
	pc.peers.Range(func(k, v any) bool {
		ps = append(ps, v.(*peer))
		pc.peers.Delete(k)
		return true
	})
	pc.mu.Unlock()
	pc.cancel()
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.close())
	}
	return errors.Join(errs...)
}
