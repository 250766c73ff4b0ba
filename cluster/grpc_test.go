package cluster_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/peer"
)

// grpcCluster runs k nodes in this process over real loopback sockets: real
// memberlist gossip, real gRPC servers and peer clients.
func grpcCluster(t testing.TB, k int) ([]*cluster.Node, []*transport.Server) {
	t.Helper()
	cfgs := make([]cluster.Config, k)
	lns := make([]net.Listener, k)
	peers := make([]*peer.PeerClient, k)
	t0 := time.Date(2026, 11, 22, 12, 0, 30, 0, time.UTC)
	for i := range cfgs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
		name := fmt.Sprintf("g%d", i)
		cfgs[i] = cluster.NodeConfig(t, name, ln.Addr().String())
		cfgs[i].Now = cluster.FixedClock(t0)
		// The peer client's deadline is the node's, as `sluice serve` wires
		// them (the harness's 2 s leaves room for -race on a busy machine;
		// the client's own default, 250 ms, did not).
		peers[i] = peer.NewPeerClient(peer.PeerConfig{NodeName: name, NodeAddr: cfgs[i].GRPCAddr, ClusterName: cfgs[i].ClusterName, Timeout: cfgs[i].ForwardTimeout})
		t.Cleanup(func() { peers[i].Close() })
	}
	nodes := cluster.StartNodes(t, cfgs, func(i int) cluster.Peers { return peers[i] })
	srvs := make([]*transport.Server, k)
	for i, n := range nodes {
		srv, err := transport.NewServer(transport.ServerConfig{GRPCListener: lns[i], Handler: n, Peer: n, ClusterName: cfgs[i].ClusterName, Owners: testOwners{n}})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		srv.SetReady(true)
		// As `sluice serve` stops: the node leaves (handing its counters
		// on over the others' servers) before its own server stops; the
		// node's Shutdown, registered earlier, runs after.
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			if err := n.Leave(ctx); err != nil {
				t.Errorf("leave %s: %v", n.Name(), err)
			}
			srv.Shutdown(ctx)
		})
		srvs[i] = srv
	}
	return nodes, srvs
}

func TestThreeNodesOverGRPCAdmitExactlyTheLimit(t *testing.T) {
	t.Parallel()
	nodes, srvs := grpcCluster(t, 3)
	clients := make([]*client.Node, len(srvs))
	for i, s := range srvs {
		c, err := client.Dial(s.GRPCAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	admitted := 0
	owners := map[string]int{}
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := clients[i%3].Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{{
			Name: "api", Key: "user:42", Hits: proto.Int64(1), Limit: 100, WindowMs: 60_000,
		}}})
		cancel()
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		r := resp.Responses[0]
		if r.Error != "" {
			t.Fatalf("check %d: %s", i, r.Error)
		}
		if r.Owner != nodes[i%3].Name() {
			owners[r.Owner]++ // decided by another node than the one asked
		}
		if r.Status == sluicev1.Status_STATUS_UNDER_LIMIT {
			admitted++
		}
	}
	if unspent := cluster.UnspentLeases(nodes); int64(admitted) != 100-unspent {
		t.Fatalf("admitted %d of 300 with limit 100 over gRPC and %d leased hits unspent, want exactly %d", admitted, unspent, 100-unspent)
	}
	// Every answer comes from the key's owner, or from the node asked
	// (a lease the owner granted it).
	if len(owners) != 1 {
		t.Fatalf("one key decided by other nodes than its owner and the one asked: %v", owners)
	}
}

func TestGRPCBatchAcrossOwnersKeepsOrderAndErrors(t *testing.T) {
	t.Parallel()
	nodes, srvs := grpcCluster(t, 3)
	defer func() {
		if t.Failed() {
			logPaths(t, nodes)
		}
	}()
	c, err := client.Dial(srvs[0].GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := &sluicev1.CheckRequest{}
	for k := range 50 {
		req.Requests = append(req.Requests, &sluicev1.RateLimitRequest{Name: "b", Key: fmt.Sprint("k", k), Hits: proto.Int64(int64(k % 4)), Limit: 2, WindowMs: 60_000})
	}
	req.Requests = append(req.Requests, &sluicev1.RateLimitRequest{Name: "b", Key: "", Hits: proto.Int64(1), Limit: 2, WindowMs: 60_000})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]bool{}
	for k := range 50 {
		r := resp.Responses[k]
		hits := int64(k % 4)
		wantAllowed := hits <= 2
		if got := r.Status == sluicev1.Status_STATUS_UNDER_LIMIT; got != wantAllowed || r.Error != "" {
			t.Fatalf("item %d (hits %d): %v", k, hits, r)
		}
		if want := 2 - hits; wantAllowed && r.Remaining != want {
			t.Fatalf("item %d (hits %d): remaining %d, want %d", k, hits, r.Remaining, want)
		}
		owners[r.Owner] = true
	}
	if len(owners) != 3 {
		t.Fatalf("50 keys decided by %d owners", len(owners))
	}
	if last := resp.Responses[50]; last.Error == "" || last.Status != sluicev1.Status_STATUS_UNSPECIFIED {
		t.Fatalf("empty key answered %v", last)
	}
}

// logPaths logs the counters that tell which path each node's checks took
// (forward, redirect, failover), for a failed exact-count test.
func logPaths(t *testing.T, nodes []*cluster.Node) {
	t.Helper()
	for _, n := range nodes {
		st := n.Status()
		t.Logf("%s: checks %d forwarded %d forward-errors %d failovers %d redirects %d pulls %d pull-errors %d rejoins %d members %+v",
			st.Node, st.Checks, st.Forwarded, st.ForwardErrors, st.Failovers, st.Redirects, st.Pulls, st.PullErrors, st.Rejoins, st.Members)
	}
}

// The in-process decision on the owner: hash, route, shard lock, LRU,
// algorithm.
func BenchmarkNodeCheckOwner(b *testing.B) {
	cfg := cluster.NodeConfig(b, "solo", "127.0.0.1:1")
	n, err := cluster.New(cfg, cluster.NoPeers{})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Shutdown(context.Background())
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprint("user:", i)
	}
	// In a shuffled order, as in BenchmarkOwnerDecision.
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	reqs := make([]check.Request, 1)
	out := make([]check.Outcome, 1)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i == len(keys) {
			i = 0
		}
		reqs[0] = check.Request{Name: "api", Key: keys[i], Hits: 1, Limit: bucket.Limit{Limit: 1 << 40, WindowMS: 60_000}}
		n.Check(ctx, reqs, out)
	}
}
