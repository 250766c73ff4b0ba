package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// MaxBatch is the most items one call may carry; a node refuses a larger
// call whole with InvalidArgument.
const MaxBatch = 1000

// Request is one check: Hits against the limit for (Name, Key).
type Request struct {
	// Name is the limit's namespace ("api.create_url"); Key the entity
	// ("user:42"). Both are required: name 1–128 bytes without NUL, key
	// 1–1024 bytes.
	Name, Key string
	// Hits is the cost of the request; 0 means 1. Set Peek to ask without
	// consuming.
	Hits int64
	// Peek asks for the state of the limit without consuming (hits 0 on the
	// wire); Hits is then ignored.
	Peek bool
	// Limit is the number of hits allowed per Window; 0 takes limit, window
	// and algorithm from the rule in force for Name on the node.
	Limit int64
	// Window is the length of the limit's window, rounded down to whole
	// milliseconds (at least 1 ms when Limit is set).
	Window time.Duration
	// Algorithm counts the limit; AlgorithmUnspecified is SlidingWindow.
	Algorithm Algorithm
	// Burst is the capacity of the bucket algorithms and GCRA; 0 means
	// Limit.
	Burst int64
}

// Result is the answer to one Request.
type Result struct {
	// Allowed reports whether the hits were admitted.
	Allowed bool
	// Limit is the limit in force (for a rules-based request, the rule's);
	// Remaining how many hits it admits now.
	Limit, Remaining int64
	// ResetAfter is the time until the window or bucket is full again;
	// RetryAfter the time to wait before the same hits would be admitted
	// (0 when allowed, except for a shaping leaky bucket: docs/algorithms.md).
	ResetAfter, RetryAfter time.Duration
	// Owner is the name of the node that decided.
	Owner string
	// Err, in the results of CheckBatch only, is the node's refusal of this
	// one item (an *ItemError: invalid name, key or limit); the other
	// fields are then zero. Check returns it as its error.
	Err error
}

// ItemError is a node's refusal of one item of a call (invalid name, key,
// hits or limit), as opposed to the failure of the whole call, which is a
// gRPC status error.
type ItemError struct {
	Name, Key string
	Msg       string // the node's message
}

func (e *ItemError) Error() string {
	return fmt.Sprintf("sluice: check %q/%q refused: %s", e.Name, e.Key, e.Msg)
}

// Option configures New.
type Option func(*options)

type options struct {
	// tls makes the TLS dial option. It is a function so that a program
	// that never calls WithTLS links none of crypto/tls's handshake code.
	tls          func() (grpc.DialOption, error)
	dial         []grpc.DialOption
	timeout      time.Duration
	owners       bool
	ownerRefresh time.Duration
}

// WithTLS connects with TLS, verifying the nodes and presenting a
// certificate as f says. Without it the connections are plaintext.
func WithTLS(f TLSFiles) Option {
	return func(o *options) {
		o.tls = func() (grpc.DialOption, error) {
			cfg, err := f.TLSConfig()
			if err != nil {
				return nil, err
			}
			return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
		}
	}
}

// WithDialOptions adds gRPC dial options, applied after the defaults of
// Dial and the TLS credentials of WithTLS (so they can override them).
// The same options dial every node.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithCallTimeout bounds every call (all its attempts together) by d, in
// addition to the caller's context. 0, the default, leaves the context
// alone.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// Client is the Go client of a Sluice cluster: it spreads calls over its
// nodes round robin and, when a node answers UNAVAILABLE (down, draining,
// unreachable), retries the call on the next one, each node at most once
// per call and never past the context's deadline. Other errors
// (InvalidArgument, DeadlineExceeded, ResourceExhausted...) are returned
// as they are. Any node can answer any key: the cluster forwards to the
// owner. With WithOwnerRouting it sends each check straight to its owner
// instead.
//
// It is safe for concurrent use; make one per application and share it.
// New connects lazily, on the first call to each node; Close closes every
// connection and waits for the background fetches of owner tables.
type Client struct {
	nodes   []*Node
	addrs   []string
	dial    []grpc.DialOption
	next    atomic.Uint32
	timeout time.Duration
	owners  *ownerRouter // nil without WithOwnerRouting
}

// New returns a Client for the nodes at addrs ("host:port", at least
// one). It starts nothing and sends nothing; an error means an address or
// option is unusable (TLS files that cannot be read).
func New(addrs []string, opts ...Option) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("sluice client: New needs at least one node address")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var dial []grpc.DialOption
	if o.tls != nil {
		creds, err := o.tls()
		if err != nil {
			return nil, fmt.Errorf("sluice client: %w", err)
		}
		dial = append(dial, creds)
	}
	dial = append(dial, o.dial...)
	c := &Client{addrs: append([]string(nil), addrs...), dial: dial, timeout: o.timeout}
	for _, a := range addrs {
		n, err := Dial(a, dial...)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if o.owners {
		c.owners = newOwnerRouter(c, o.ownerRefresh)
	}
	return c, nil
}

// RefreshOwners fetches the owner table now, from the first of the
// client's nodes (then the table's members) that is ready and answers,
// and returns why none did. Without WithOwnerRouting it does nothing.
// Calls fetch tables by themselves; this is for a client that wants its
// first calls routed, and for tests.
func (c *Client) RefreshOwners(ctx context.Context) error {
	if c.owners == nil {
		return nil
	}
	return c.owners.fetch(ctx)
}

// OwnerStats reports what owner routing did so far (zero without
// WithOwnerRouting).
func (c *Client) OwnerStats() OwnerStats {
	if c.owners == nil {
		return OwnerStats{}
	}
	return c.owners.stats()
}

// Owner returns the name of the member that owns (name, key) in the owner
// table the client routes by, and false without WithOwnerRouting or before
// the client has a table. A load tool uses it to fill each batch with the
// keys of one owner, so that the batch is one call.
func (c *Client) Owner(name, key string) (string, bool) {
	if c.owners == nil {
		return "", false
	}
	t := c.owners.tbl.Load()
	if t == nil {
		return "", false
	}
	return t.names[t.owner(name, key)], true
}

// Addrs returns the node addresses c was made with.
func (c *Client) Addrs() []string { return append([]string(nil), c.addrs...) }

// Close closes the connections to every node; calls in progress fail.
func (c *Client) Close() error {
	var errs []error
	if c.owners != nil {
		errs = append(errs, c.owners.close())
	}
	for _, n := range c.nodes {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}

// Check decides one request. The error is an *ItemError when the node
// refused the request as invalid, or the gRPC status error of the last
// attempt (status.Code tells Unavailable, DeadlineExceeded...).
func (c *Client) Check(ctx context.Context, r Request) (Result, error) {
	res, err := c.CheckBatch(ctx, []Request{r})
	if err != nil {
		return Result{}, err
	}
	return res[0], res[0].Err
}

// CheckBatch decides rs in one call (at most MaxBatch items: more is
// refused whole with InvalidArgument); the results come in request order,
// an item the node refused carrying its *ItemError in Err. The error is
// that of the whole call, as for Check.
func (c *Client) CheckBatch(ctx context.Context, rs []Request) ([]Result, error) {
	if len(rs) == 0 {
		return nil, nil
	}
	req := &sluicev1.CheckRequest{Requests: make([]*sluicev1.RateLimitRequest, len(rs))}
	for i := range rs {
		req.Requests[i] = rs[i].toProto()
	}
	resp, err := c.CheckProto(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(resp.Responses) != len(rs) {
		return nil, status.Errorf(codes.Internal, "sluice: %d answers to %d checks", len(resp.Responses), len(rs))
	}
	out := make([]Result, len(rs))
	for i, m := range resp.Responses {
		out[i] = resultFromProto(rs[i], m)
	}
	return out, nil
}

// CheckProto is CheckBatch on the wire messages, for callers that build
// them (the load tool): it sends req as the client's options say (to its
// owners with WithOwnerRouting, else to the next node in turn) and returns
// the answers in request order, or the error of the whole call. The
// client does not modify req.
func (c *Client) CheckProto(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	if c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	if c.owners != nil && len(req.GetRequests()) > 0 && len(req.GetRequests()) <= MaxBatch {
		if resp, ok, err := c.owners.route(ctx, req); ok {
			return resp, err
		}
	}
	return c.call(ctx, req)
}

// call sends req to the nodes in turn from the next in the rotation until
// one answers with anything but UNAVAILABLE, each node at most once.
func (c *Client) call(ctx context.Context, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	n := len(c.nodes)
	start := int((c.next.Add(1) - 1) % uint32(n)) // in uint32: no negative index on 32-bit platforms
	var err error
	for i := range n {
		var resp *sluicev1.CheckResponse
		resp, err = c.nodes[(start+i)%n].Check(ctx, req)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return resp, err
		}
	}
	return nil, err
}

func (r *Request) toProto() *sluicev1.RateLimitRequest {
	hits := r.Hits
	switch {
	case r.Peek:
		hits = 0
	case hits == 0:
		hits = 1
	}
	return &sluicev1.RateLimitRequest{
		Name:      r.Name,
		Key:       r.Key,
		Hits:      &hits,
		Limit:     r.Limit,
		WindowMs:  r.Window.Milliseconds(),
		Algorithm: sluicev1.Algorithm(r.Algorithm),
		Burst:     r.Burst,
	}
}

// resultFromProto reads one answer. An error, no verdict or a status this
// release does not know is the item's *ItemError, never a verdict.
func resultFromProto(r Request, m *sluicev1.RateLimitResponse) Result {
	var allowed bool
	msg := m.GetError()
	switch st := m.GetStatus(); {
	case msg != "":
	case m == nil:
		msg = "missing response"
	case st == sluicev1.Status_STATUS_UNDER_LIMIT:
		allowed = true
	case st == sluicev1.Status_STATUS_OVER_LIMIT:
	case st == sluicev1.Status_STATUS_UNSPECIFIED:
		msg = "no verdict"
	default:
		msg = "unknown status " + st.String()
	}
	if msg != "" {
		return Result{Err: &ItemError{Name: r.Name, Key: r.Key, Msg: msg}}
	}
	return Result{
		Allowed:    allowed,
		Limit:      m.GetLimit(),
		Remaining:  m.GetRemaining(),
		ResetAfter: time.Duration(m.GetResetAfterMs()) * time.Millisecond,
		RetryAfter: time.Duration(m.GetRetryAfterMs()) * time.Millisecond,
		Owner:      m.GetOwner(),
	}
}

// String describes a result as the CLI does, for logs.
func (r Result) String() string {
	if r.Err != nil {
		return r.Err.Error()
	}
	var b strings.Builder
	if r.Allowed {
		fmt.Fprintf(&b, "allowed: %d of %d remaining", r.Remaining, r.Limit)
	} else {
		fmt.Fprintf(&b, "over limit of %d: retry after %v", r.Limit, r.RetryAfter)
	}
	if r.Owner != "" {
		fmt.Fprintf(&b, " (decided by %s)", r.Owner)
	}
	return b.String()
}
