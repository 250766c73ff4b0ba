package client

// Owner-aware routing of Client: the client learns the owner table
// from any node (RateLimiter.Owners) and sends each check straight to its
// key's owner, skipping the forward hop. Nodes still answer any key, so a
// stale table costs a forward, never a wrong answer.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// OwnerHash names the key hash of an owner table (OwnersResponse.hash):
// XXH64, seed 0, of name, a zero byte, then key; OwnerKeyHash computes it.
// A client routes by a table only when it knows the table's hash.
const OwnerHash = "xxh64-name-nul-key"

// Defaults of owner routing (WithOwnerRouting).
const (
	// DefaultOwnerRefresh is how old a table may get before a call fetches
	// a new one (in the background; the call goes on with the old one).
	DefaultOwnerRefresh = 5 * time.Second
	// ownerMinRefresh is the shortest time between two fetches, whatever
	// asks for them (answers decided by another node, failed owners).
	ownerMinRefresh = 200 * time.Millisecond
	// ownerDownFor is how long an owner that failed a call is skipped:
	// its keys go to any node meanwhile (the cluster forwards them).
	ownerDownFor = time.Second
	// ownerFetchTimeout bounds one node's answer to Owners.
	ownerFetchTimeout = 2 * time.Second
)

// OwnerKeyHash is the hash that OwnerHash names, the one the nodes place
// keys with: XXH64 (seed 0) of name + "\x00" + key. It allocates nothing.
func OwnerKeyHash(name, key string) uint64 {
	d := newXXH64()
	d.writeString(name)
	d.writeString("\x00")
	d.writeString(key)
	return d.sum()
}

// WithOwnerRouting makes the client send each check straight to the node
// that owns its key, as token-aware Cassandra drivers and Redis Cluster
// clients do, instead of to any node (which forwards two thirds of the
// checks of a three-node cluster to their owners). The client fetches the
// owner table from one of its nodes (RateLimiter.Owners; RefreshOwners
// does it at once), again when it is older than refresh (0:
// DefaultOwnerRefresh), and soon after an answer comes from a node other
// than the owner in the table or an owner fails a call. A batch is split
// into one call per owner, sent in parallel, answers in request order.
// An owner that fails a call with UNAVAILABLE is skipped for a second:
// its checks, and every check while the client has no usable table, go to
// the client's nodes in turn as without this option. One whose call runs
// out of time is skipped for a second too (that call returns
// DEADLINE_EXCEEDED: it has no time left to go elsewhere). Connections:
// one per member of the table (the client's own nodes' connections are
// reused when the addresses match), dialled with the client's options
// (TLS included); one that has left the table is closed when the next
// different table comes, or by Close.
func WithOwnerRouting(refresh time.Duration) Option {
	return func(o *options) {
		o.owners = true
		o.ownerRefresh = refresh
	}
}

// OwnerStats counts what owner routing did, for tests and load tools.
type OwnerStats struct {
	Routed    uint64 // checks sent straight to the owner in the table
	Fallback  uint64 // checks sent to any node: no table, owner skipped or failed
	Moved     uint64 // checks decided by another node than the table's owner
	Refreshes uint64 // tables fetched
	Version   uint64 // version of the table in use (0: none)
	Members   int    // members of the table in use
}

// ownerTable is one fetched table, immutable.
type ownerTable struct {
	version    uint64
	partitions uint64
	owners     []uint32
	names      []string
	nodes      []*ownerConn // by member index
	fetched    time.Time
}

// ownerConn is the connection to one member.
type ownerConn struct {
	addr      string
	c         *Node
	seed      bool         // one of the client's own nodes: closed by Close only
	downUntil atomic.Int64 // unix ns: skipped until then after a failure
}

// ownerRouter is the state of owner routing of one Client.
type ownerRouter struct {
	cc      *Client
	refresh time.Duration
	now     func() time.Time

	tbl        atomic.Pointer[ownerTable]
	stale      atomic.Bool  // an answer or a failure says the table is out of date
	lastFetch  atomic.Int64 // unix ns of the last fetch started
	refreshing atomic.Bool
	next       atomic.Uint32 // rotation of the nodes asked for the table

	routed, fallback, moved, refreshes atomic.Uint64

	mu      sync.Mutex // guards conns, retired, closed; serialises installs
	conns   map[string]*ownerConn
	retired []*ownerConn // left the table; closed when the next table comes
	closed  bool
	wg      sync.WaitGroup // background fetches
	ctx     context.Context
	cancel  context.CancelFunc
}

func newOwnerRouter(cc *Client, refresh time.Duration) *ownerRouter {
	if refresh <= 0 {
		refresh = DefaultOwnerRefresh
	}
	r := &ownerRouter{cc: cc, refresh: refresh, now: time.Now, conns: map[string]*ownerConn{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	for i, a := range cc.addrs {
		if _, ok := r.conns[a]; !ok {
			r.conns[a] = &ownerConn{addr: a, c: cc.nodes[i], seed: true}
		}
	}
	return r
}

// close stops background fetches and closes the members' connections
// (not the client's own nodes'; Client.Close does those).
func (r *ownerRouter) close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, oc := range r.conns {
		if !oc.seed {
			errs = append(errs, oc.c.Close())
		}
	}
	for _, oc := range r.retired {
		errs = append(errs, oc.c.Close())
	}
	r.conns, r.retired = nil, nil
	return errors.Join(errs...)
}

func (r *ownerRouter) stats() OwnerStats {
	s := OwnerStats{Routed: r.routed.Load(), Fallback: r.fallback.Load(), Moved: r.moved.Load(), Refreshes: r.refreshes.Load()}
	if t := r.tbl.Load(); t != nil {
		s.Version, s.Members = t.version, len(t.names)
	}
	return s
}

// table returns the table to route by (nil: none), starting a background
// fetch when it is old or known to be stale.
func (r *ownerRouter) table() *ownerTable {
	t := r.tbl.Load()
	now := r.now()
	if t == nil || r.stale.Load() || now.Sub(t.fetched) >= r.refresh {
		r.maybeFetch(now)
	}
	return t
}

// maybeFetch starts a background fetch unless one runs or one started less
// than ownerMinRefresh ago (ownerDownFor while the client has no table:
// nodes that serve no table, or none that is ready, are asked once a
// second).
func (r *ownerRouter) maybeFetch(now time.Time) {
	gap := ownerMinRefresh
	if r.tbl.Load() == nil {
		gap = ownerDownFor
	}
	if now.UnixNano()-r.lastFetch.Load() < int64(gap) || !r.refreshing.CompareAndSwap(false, true) {
		return
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.refreshing.Store(false)
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		defer r.refreshing.Store(false)
		_ = r.fetch(r.ctx)
	}()
}

// fetch asks the nodes in turn (the client's own, then the table's
// members) for the owner table until a ready node answers with one this
// client can use, and installs it.
func (r *ownerRouter) fetch(ctx context.Context) error {
	r.lastFetch.Store(r.now().UnixNano())
	r.stale.Store(false)
	cands := r.candidates()
	start := int((r.next.Add(1) - 1) % uint32(len(cands))) // in uint32: no negative index on 32-bit platforms
	var errs []error
	for i := range cands {
		oc := cands[(start+i)%len(cands)]
		fctx, cancel := context.WithTimeout(ctx, ownerFetchTimeout)
		resp, err := oc.c.Owners(fctx)
		cancel()
		if err == nil {
			err = r.install(resp)
			if err == nil {
				return nil
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", oc.addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	// Try again soon: the nodes are most likely joining, leaving or
	// restarting.
	r.stale.Store(true)
	return fmt.Errorf("sluice client: no node gave a usable owner table: %w", errors.Join(errs...))
}

// candidates are the nodes to ask for a table: the client's own, then the
// members of the current table that are not among them.
func (r *ownerRouter) candidates() []*ownerConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*ownerConn
	for _, a := range r.cc.addrs {
		if oc := r.conns[a]; oc != nil {
			out = append(out, oc)
		}
	}
	if t := r.tbl.Load(); t != nil {
		for _, oc := range t.nodes {
			if !oc.seed {
				out = append(out, oc)
			}
		}
	}
	return out
}

// errNotReady is a table refused because its node is joining or leaving.
var errNotReady = errors.New("node not ready (joining or leaving)")

// install checks resp and makes it the current table. A table with no
// owners (a node alone and leaving, or not yet in its own ring) is refused.
func (r *ownerRouter) install(resp *sluicev1.OwnersResponse) error {
	switch {
	case !resp.GetReady():
		return errNotReady
	case resp.GetHash() != OwnerHash:
		return fmt.Errorf("owner table hashes keys with %q, this client knows only %q", resp.GetHash(), OwnerHash)
	case resp.GetPartitions() < 1 || int64(len(resp.GetOwners())) != resp.GetPartitions():
		return fmt.Errorf("owner table has %d owners for %d partitions", len(resp.GetOwners()), resp.GetPartitions())
	case len(resp.GetMembers()) == 0:
		return errors.New("owner table has no members")
	}
	for p, o := range resp.GetOwners() {
		if int(o) >= len(resp.GetMembers()) {
			return fmt.Errorf("owner table: partition %d has owner %d of %d members", p, o, len(resp.GetMembers()))
		}
	}
	for i, m := range resp.GetMembers() {
		if m.GetName() == "" || m.GetGrpcAddr() == "" {
			return fmt.Errorf("owner table: member %d has name %q and address %q", i, m.GetName(), m.GetGrpcAddr())
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("client closed")
	}
	if cur := r.tbl.Load(); cur != nil && cur.version == resp.GetVersion() {
		// Same table: only its age changes.
		t := *cur
		t.fetched = r.now()
		r.tbl.Store(&t)
		r.refreshes.Add(1)
		return nil
	}
	t := &ownerTable{
		version:    resp.GetVersion(),
		partitions: uint64(resp.GetPartitions()),
		owners:     resp.GetOwners(),
		names:      make([]string, len(resp.GetMembers())),
		nodes:      make([]*ownerConn, len(resp.GetMembers())),
		fetched:    r.now(),
	}
	var dialed []*ownerConn
	for i, m := range resp.GetMembers() {
		t.names[i] = m.GetName()
		oc := r.conns[m.GetGrpcAddr()]
		if oc == nil {
			c, err := Dial(m.GetGrpcAddr(), r.cc.dial...)
			if err != nil {
				for _, d := range dialed {
					delete(r.conns, d.addr)
					d.c.Close()
				}
				return err
			}
			oc = &ownerConn{addr: m.GetGrpcAddr(), c: c}
			r.conns[oc.addr] = oc
			dialed = append(dialed, oc)
		}
		t.nodes[i] = oc
	}
	// Connections that left an earlier table were kept for the calls that
	// may still use them; one table later they go.
	for _, oc := range r.retired {
		oc.c.Close()
	}
	r.retired = r.retired[:0]
	in := make(map[string]bool, len(t.nodes))
	for _, oc := range t.nodes {
		in[oc.addr] = true
	}
	for a, oc := range r.conns {
		if !in[a] && !oc.seed {
			delete(r.conns, a)
			r.retired = append(r.retired, oc)
		}
	}
	r.tbl.Store(t)
	r.refreshes.Add(1)
	return nil
}

// owner returns the index of the member owning (name, key) in t.
func (t *ownerTable) owner(name, key string) uint32 {
	return t.owners[OwnerKeyHash(name, key)%t.partitions]
}

// usable reports whether the member can take calls now.
func (oc *ownerConn) usable(now time.Time) bool {
	return oc.downUntil.Load() <= now.UnixNano()
}

// ownerFailed reports whether err from a member means the member, not the
// call, failed: the checks then go to any node. A Canceled call whose
// context is alive was cut by the closing of a retired connection.
func ownerFailed(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled:
		return true
	}
	return false
}

// ownerSlow reports whether the call ran out of time at the member (a host
// that drops packets, or one too busy to answer in time). The call has no
// time left to go elsewhere, but the next ones skip the member for a
// while: a node they reach instead forwards to it, or fails over, with a
// deadline of its own.
func ownerSlow(ctx context.Context, err error) bool {
	return status.Code(err) == codes.DeadlineExceeded || (err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded))
}

// route sends req by the owner table: straight to the owner when every
// item has the same one, else one call per owner in parallel. ok is false
// when there is no table, and the caller sends req to any node.
func (r *ownerRouter) route(ctx context.Context, req *sluicev1.CheckRequest) (resp *sluicev1.CheckResponse, ok bool, err error) {
	t := r.table()
	if t == nil {
		r.fallback.Add(uint64(len(req.Requests)))
		return nil, false, nil
	}
	items := req.Requests
	first := t.owner(items[0].GetName(), items[0].GetKey())
	same := true
	for _, it := range items[1:] {
		if t.owner(it.GetName(), it.GetKey()) != first {
			same = false
			break
		}
	}
	if same {
		resp, err = r.send(ctx, t, first, req)
		return resp, true, err
	}
	resp, err = r.split(ctx, t, req)
	return resp, true, err
}

// send sends req, whose items are all owned by member o of t, to that
// member, or to any node when the member is skipped or fails.
func (r *ownerRouter) send(ctx context.Context, t *ownerTable, o uint32, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	oc := t.nodes[o]
	n := uint64(len(req.Requests))
	if !oc.usable(r.now()) {
		r.fallback.Add(n)
		return r.cc.call(ctx, req)
	}
	resp, err := oc.c.Check(ctx, req)
	if ownerFailed(ctx, err) {
		oc.downUntil.Store(r.now().Add(ownerDownFor).UnixNano())
		r.stale.Store(true)
		r.fallback.Add(n)
		return r.cc.call(ctx, req)
	}
	if err != nil {
		if ownerSlow(ctx, err) {
			oc.downUntil.Store(r.now().Add(ownerDownFor).UnixNano())
			r.stale.Store(true)
		}
		return resp, err
	}
	r.routed.Add(n)
	name := t.names[o]
	for _, a := range resp.GetResponses() {
		if a.GetOwner() != name && a.GetOwner() != "" {
			// Decided elsewhere: forwarded by a member whose view differs,
			// or by a replica standing in. A newer table may know better.
			r.moved.Add(1)
			r.stale.Store(true)
		}
	}
	return resp, nil
}

// split sends req's items in one call per owner, in parallel, and puts the
// answers back in request order. The first call error fails the whole
// call, as one call to one node would.
func (r *ownerRouter) split(ctx context.Context, t *ownerTable, req *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	type group struct {
		owner uint32
		idx   []int
		resp  *sluicev1.CheckResponse
		err   error
	}
	var groups []*group
	byOwner := map[uint32]*group{}
	for i, it := range req.Requests {
		o := t.owner(it.GetName(), it.GetKey())
		g := byOwner[o]
		if g == nil {
			g = &group{owner: o}
			byOwner[o] = g
			groups = append(groups, g)
		}
		g.idx = append(g.idx, i)
	}
	run := func(g *group) {
		sub := &sluicev1.CheckRequest{Requests: make([]*sluicev1.RateLimitRequest, len(g.idx))}
		for j, i := range g.idx {
			sub.Requests[j] = req.Requests[i]
		}
		g.resp, g.err = r.send(ctx, t, g.owner, sub)
		if g.err == nil && len(g.resp.GetResponses()) != len(g.idx) {
			g.err = status.Errorf(codes.Internal, "sluice: %d answers to %d checks", len(g.resp.GetResponses()), len(g.idx))
		}
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(g)
		}()
	}
	run(groups[0])
	wg.Wait()
	out := &sluicev1.CheckResponse{Responses: make([]*sluicev1.RateLimitResponse, len(req.Requests))}
	for _, g := range groups {
		if g.err != nil {
			return nil, g.err
		}
		for j, i := range g.idx {
			out.Responses[i] = g.resp.Responses[j]
		}
	}
	return out, nil
}
