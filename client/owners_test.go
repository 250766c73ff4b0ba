package client

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// fakeRing is the placement a fake cluster shares: every fake node answers
// Owners with it and, in Check, names the owner it says as the decider,
// counting a forward for every item it does not own itself.
type fakeRing struct {
	resp atomic.Pointer[sluicev1.OwnersResponse]
}

// set places partitions on the members by owners (member indexes).
func (f *fakeRing) set(names, addrs []string, owners []uint32, version uint64) {
	r := &sluicev1.OwnersResponse{Ready: true, Version: version, Hash: OwnerHash, Partitions: int64(len(owners)), Owners: owners}
	for i := range names {
		r.Members = append(r.Members, &sluicev1.OwnerMember{Name: names[i], GrpcAddr: addrs[i]})
	}
	f.resp.Store(r)
}

func (f *fakeRing) ownerOf(name, key string) string {
	r := f.resp.Load()
	return r.Members[r.Owners[OwnerKeyHash(name, key)%uint64(r.Partitions)]].Name
}

// fakeCluster starts k fake nodes sharing one ring of 31 partitions,
// placed at random.
func fakeCluster(t *testing.T, k int, seed uint64, opts ...grpc.ServerOption) ([]*fakeNode, *fakeRing) {
	t.Helper()
	fr := &fakeRing{}
	nodes := make([]*fakeNode, k)
	names, addrs := make([]string, k), make([]string, k)
	for i := range nodes {
		nodes[i] = startNode(t, &fakeNode{name: fmt.Sprintf("n%d", i), ring: fr}, opts...)
		names[i], addrs[i] = nodes[i].name, nodes[i].addr
	}
	fr.set(names, addrs, randomOwners(31, k, seed), seed)
	return nodes, fr
}

func randomOwners(partitions, members int, seed uint64) []uint32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	owners := make([]uint32, partitions)
	for p := range owners {
		owners[p] = uint32(rng.IntN(members))
	}
	return owners
}

func forwardsOf(nodes []*fakeNode) (n int64) {
	for _, nd := range nodes {
		n += nd.forwards.Load()
	}
	return n
}

func TestOwnerRoutingSendsEachCheckToItsOwner(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 3, 1)
	c := newClient(t, []string{nodes[0].addr}, WithOwnerRouting(time.Hour))
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	const checks = 300
	for i := range checks {
		key := fmt.Sprint("user:", i)
		res, err := c.Check(ctx, Request{Name: "api", Key: key, Limit: 10, Window: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if want := fr.ownerOf("api", key); res.Owner != want {
			t.Fatalf("%s decided by %s, want its owner %s", key, res.Owner, want)
		}
	}
	if f := forwardsOf(nodes); f != 0 {
		t.Errorf("%d of %d checks reached a node that does not own their key", f, checks)
	}
	var got int64
	for _, n := range nodes {
		got += n.checks.Load()
		if n.checks.Load() == 0 {
			t.Errorf("node %s got no check: the client did not spread by owner", n.name)
		}
	}
	if got != checks {
		t.Errorf("nodes got %d checks, want %d", got, checks)
	}
	st := c.OwnerStats()
	if st.Routed != checks || st.Fallback != 0 || st.Moved != 0 || st.Members != 3 {
		t.Errorf("stats %+v, want %d routed, none to any node or moved, 3 members", st, checks)
	}
}

func TestOwnerRoutingSplitsABatchPerOwnerInOrder(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 3, 2)
	c := newClient(t, []string{nodes[1].addr}, WithOwnerRouting(time.Hour))
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 60
	rs := make([]Request, n)
	owners := map[string]bool{}
	for i := range rs {
		// Hits differ per item, so each answer's Remaining (1000 - hits)
		// says which item it answers.
		rs[i] = Request{Name: "api", Key: fmt.Sprint("k", i), Hits: int64(i + 1), Limit: 1000, Window: time.Minute}
		owners[fr.ownerOf("api", rs[i].Key)] = true
	}
	rs[7].Key = "" // an invalid item keeps its own error and place
	res, err := c.CheckBatch(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if i == 7 {
			if r.Err == nil {
				t.Errorf("item 7 (empty key): no error")
			}
			continue
		}
		if r.Err != nil || r.Remaining != 1000-int64(i+1) || r.Owner != fr.ownerOf("api", rs[i].Key) {
			t.Errorf("item %d: %+v, want remaining %d from %s", i, r, 1000-(i+1), fr.ownerOf("api", rs[i].Key))
		}
	}
	var calls int64
	for _, nd := range nodes {
		calls += nd.calls.Load()
	}
	if calls != int64(len(owners)) {
		t.Errorf("%d calls for a batch over %d owners, want one per owner", calls, len(owners))
	}
	if f := forwardsOf(nodes); f != 0 {
		t.Errorf("%d items reached a node that does not own them", f)
	}
}

func TestOwnerRoutingRefreshesWhenAnotherNodeDecides(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 3, 3)
	c := newClient(t, []string{nodes[2].addr}, WithOwnerRouting(time.Hour))
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	// The cluster moves partitions (a member joined elsewhere): the
	// client's table is stale, answers name other deciders, and the client
	// fetches the new table by itself (at most every ownerMinRefresh).
	old := fr.resp.Load()
	addrs := []string{nodes[0].addr, nodes[1].addr, nodes[2].addr}
	fr.set([]string{"n0", "n1", "n2"}, addrs, randomOwners(31, 3, 99), old.Version+1)
	i := 0
	waitFor(t, 10*time.Second, "the client to take the new table", func() bool {
		i++
		key := fmt.Sprint("u", i%50)
		if _, err := c.Check(ctx, Request{Name: "api", Key: key, Limit: 10, Window: time.Minute}); err != nil {
			t.Fatal(err)
		}
		return c.OwnerStats().Version == old.Version+1
	})
	st := c.OwnerStats()
	if st.Moved == 0 || st.Refreshes < 2 {
		t.Errorf("stats %+v: want answers from other deciders seen and a second fetch", st)
	}
	before := forwardsOf(nodes)
	for j := range 100 {
		if _, err := c.Check(ctx, Request{Name: "api", Key: fmt.Sprint("v", j), Limit: 10, Window: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if f := forwardsOf(nodes) - before; f != 0 {
		t.Errorf("with the new table, %d of 100 checks reached a node that does not own them", f)
	}
}

func TestOwnerRoutingFallsBackWhenTheOwnerIsDown(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 3, 4)
	addrs := []string{nodes[0].addr, nodes[1].addr, nodes[2].addr}
	c := newClient(t, addrs, WithOwnerRouting(time.Hour))
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	nodes[0].stop()
	// Every check gets a decision: those whose owner (in the table) is
	// the stopped node go to a live one, which the fake cluster counts as
	// a forward.
	var down int
	for i := range 200 {
		key := fmt.Sprint("user:", i)
		if fr.ownerOf("api", key) == "n0" {
			down++
		}
		if _, err := c.Check(ctx, Request{Name: "api", Key: key, Limit: 10, Window: time.Minute}); err != nil {
			t.Fatalf("check %d (%s, owner %s): %v", i, key, fr.ownerOf("api", key), err)
		}
	}
	// A batch over every owner, the stopped one included, is answered
	// whole.
	rs := make([]Request, 30)
	for i := range rs {
		rs[i] = Request{Name: "api", Key: fmt.Sprint("b", i), Limit: 10, Window: time.Minute}
	}
	res, err := c.CheckBatch(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || !r.Allowed {
			t.Errorf("batch item %d: %+v", i, r)
		}
	}
	st := c.OwnerStats()
	if down == 0 || st.Fallback < uint64(down) {
		t.Errorf("stats %+v: want at least the %d checks owned by the stopped node sent to any node", st, down)
	}
	if nodes[0].checks.Load() != 0 {
		t.Errorf("the stopped node decided %d checks", nodes[0].checks.Load())
	}
}

func TestOwnerRoutingRefusesTablesItCannotUse(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 1, 5)
	c := newClient(t, []string{nodes[0].addr}, WithOwnerRouting(time.Hour))
	ctx := testCtx(t)
	nodes[0].notReady.Store(true)
	if err := c.RefreshOwners(ctx); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("table of a node that is not ready: %v, want it refused as not ready", err)
	}
	nodes[0].notReady.Store(false)
	good := fr.resp.Load()
	r := proto.CloneOf(good)
	r.Hash = "fnv1a"
	fr.resp.Store(r)
	if err := c.RefreshOwners(ctx); err == nil || !strings.Contains(err.Error(), `"fnv1a"`) {
		t.Errorf("table with an unknown hash: %v, want it refused naming the hash", err)
	}
	r.Hash, r.Owners = OwnerHash, r.Owners[:3]
	fr.resp.Store(r)
	if err := c.RefreshOwners(ctx); err == nil || !strings.Contains(err.Error(), "3 owners for 31 partitions") {
		t.Errorf("table short of owners: %v", err)
	}
	// Without a table every check still goes to a node.
	fr.resp.Store(good)
	res, err := c.Check(ctx, Request{Name: "api", Key: "k", Limit: 10, Window: time.Minute})
	if err != nil || !res.Allowed {
		t.Fatalf("check without a table: %+v, %v", res, err)
	}
	if st := c.OwnerStats(); st.Routed != 0 || st.Fallback != 1 || st.Version != 0 {
		t.Errorf("stats %+v, want the one check sent to any node and no table", st)
	}
}

// TestOwnerRoutingConnectsToOwnersWithTheClientsTLS: the connections to
// the members of the table are dialled with the client's TLS material, so
// nodes that require a client certificate take the routed checks (a
// connection without it would fail, and its checks go to any node).
func TestOwnerRoutingConnectsToOwnersWithTheClientsTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	nodeCA := newTestCA(t, dir, "node-ca")
	clientCA := newTestCA(t, dir, "client-ca")
	nodes, _ := fakeCluster(t, 3, 6, mtlsServer(t, nodeCA, clientCA))
	apiCert, apiKey := clientCA.issue(t, "api", x509.ExtKeyUsageClientAuth)
	c := newClient(t, []string{nodes[0].addr}, WithOwnerRouting(time.Hour),
		WithTLS(TLSFiles{CA: nodeCA.path, Cert: apiCert, Key: apiKey}))
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		if _, err := c.Check(ctx, Request{Name: "api", Key: fmt.Sprint("user:", i), Limit: 10, Window: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if st := c.OwnerStats(); st.Routed != n || st.Fallback != 0 {
		t.Errorf("stats %+v, want all %d checks routed to their owners over TLS", st, n)
	}
	for _, nd := range nodes {
		if nd.checks.Load() == 0 {
			t.Errorf("node %s got no check", nd.name)
		}
	}
	if f := forwardsOf(nodes); f != 0 {
		t.Errorf("%d checks reached a node that does not own them", f)
	}
}

// TestOwnerRoutingSkipsAnOwnerThatRanOutOfTime: a call that times out at
// its owner fails (it has no time left), and the next checks of that
// owner's keys go to another node instead of waiting on it again.
func TestOwnerRoutingSkipsAnOwnerThatRanOutOfTime(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 3, 7)
	c := newClient(t, []string{nodes[1].addr}, WithOwnerRouting(time.Hour))
	// The client's clock stands still: the owner stays skipped however
	// long the calls take on a busy machine.
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	c.owners.now = func() time.Time { return t0 }
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	var key string
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint("user:", i); fr.ownerOf("api", k) == "n0" {
			key = k
		}
	}
	nodes[0].slow.Store(true)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := c.Check(short, Request{Name: "api", Key: key, Limit: 10, Window: time.Minute})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("check at the slow owner: %v, want DeadlineExceeded", err)
	}
	res, err := c.Check(ctx, Request{Name: "api", Key: key, Limit: 10, Window: time.Minute})
	if err != nil || !res.Allowed {
		t.Fatalf("next check of the slow owner's key: %+v, %v", res, err)
	}
	if st := c.OwnerStats(); st.Fallback != 1 {
		t.Errorf("stats %+v, want the second check sent to any node", st)
	}
	if got := nodes[1].checks.Load(); got != 1 {
		t.Errorf("the client's node decided %d checks, want the one that skipped the slow owner", got)
	}
}

// BenchmarkOwnerChoice is a microbenchmark of what owner routing adds to
// a single check on the client: hash the key and look up its owner in a
// table of 7919 partitions (the ring's default).
func BenchmarkOwnerChoice(b *testing.B) {
	t := &ownerTable{partitions: 7919, owners: randomOwners(7919, 3, 1)}
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("user:", i)
	}
	b.ReportAllocs()
	var sink uint32
	for i := 0; b.Loop(); i++ {
		if i == len(keys) {
			i = 0
		}
		sink += t.owner("api", keys[i])
	}
	_ = sink
}

// Owner names the member of the table the client routes by, and a batch
// of one owner's keys is one call, to that owner.
func TestOwnerNamesTheTablesOwner(t *testing.T) {
	t.Parallel()
	nodes, fr := fakeCluster(t, 3, 7)
	plain := newClient(t, []string{nodes[0].addr})
	if o, ok := plain.Owner("api", "k"); ok {
		t.Fatalf("a client without owner routing named owner %q", o)
	}
	c := newClient(t, []string{nodes[0].addr}, WithOwnerRouting(time.Hour))
	if o, ok := c.Owner("api", "k"); ok {
		t.Fatalf("a client without a table named owner %q", o)
	}
	ctx := testCtx(t)
	if err := c.RefreshOwners(ctx); err != nil {
		t.Fatal(err)
	}
	byOwner := map[string][]*sluicev1.RateLimitRequest{}
	for i := range 200 {
		key := fmt.Sprint("user:", i)
		o, ok := c.Owner("api", key)
		if want := fr.ownerOf("api", key); !ok || o != want {
			t.Fatalf("Owner(api, %s) = %q, %v; want %q", key, o, ok, want)
		}
		byOwner[o] = append(byOwner[o], &sluicev1.RateLimitRequest{Name: "api", Key: key, Hits: proto.Int64(1), Limit: 10, WindowMs: 60_000})
	}
	for _, n := range nodes {
		reqs := byOwner[n.name]
		if len(reqs) == 0 {
			continue
		}
		before := n.calls.Load()
		if _, err := c.CheckProto(ctx, &sluicev1.CheckRequest{Requests: reqs}); err != nil {
			t.Fatal(err)
		}
		if got := n.calls.Load() - before; got != 1 {
			t.Errorf("a batch of %d keys of %s reached it in %d calls, want 1", len(reqs), n.name, got)
		}
	}
	if f := forwardsOf(nodes); f != 0 {
		t.Errorf("%d checks reached a node that does not own their key", f)
	}
}
