//go:build unix

package cluster_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// testOwners serves a node's owner table as `sluice serve` does
// (cmd/sluice/owners.go, whose own test holds it to the ring), rebuilt on
// every call: enough for the in-process clusters of these tests.
type testOwners struct{ n *cluster.Node }

func (o testOwners) Owners(context.Context) (*sluicev1.OwnersResponse, error) {
	tbl := o.n.Ring().Table()
	ms := tbl.Members()
	resp := &sluicev1.OwnersResponse{Node: o.n.Name(), Ready: o.n.Ready() && tbl.Len() > 0, Hash: client.OwnerHash, Partitions: int64(tbl.Partitions())}
	index := map[string]uint32{}
	h := fnv.New64a()
	for i, m := range ms {
		resp.Members = append(resp.Members, &sluicev1.OwnerMember{Name: m.Name, GrpcAddr: m.Addr})
		index[m.Name] = uint32(i)
		fmt.Fprintf(h, "%s\x00%s\x00", m.Name, m.Addr)
	}
	if len(ms) > 0 {
		resp.Owners = make([]uint32, tbl.Partitions())
		for p := range resp.Owners {
			m, _ := tbl.PartitionOwner(p)
			resp.Owners[p] = index[m.Name]
			_ = binary.Write(h, binary.LittleEndian, resp.Owners[p])
		}
	}
	resp.Version = h.Sum64()
	return resp, nil
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkThreeNodesSingleCheck is a microbenchmark: three nodes and the
// client in this process over loopback gRPC, 50 callers of single checks
// on 10k keys, through a client.Client that spreads calls over the nodes
// (any) or sends each to its owner (owner). cpu-ns/op is the whole
// process's CPU (client and three nodes) per check; forwards/op the
// checks the nodes forwarded per check.
func BenchmarkThreeNodesSingleCheck(b *testing.B) {
	for _, mode := range []string{"any", "owner"} {
		b.Run(mode, func(b *testing.B) {
			nodes, srvs := grpcCluster(b, 3)
			addrs := []string{srvs[0].GRPCAddr(), srvs[1].GRPCAddr(), srvs[2].GRPCAddr()}
			var opts []client.Option
			if mode == "owner" {
				opts = append(opts, client.WithOwnerRouting(0))
			}
			c, err := client.New(addrs, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.RefreshOwners(ctx); err != nil {
				b.Fatal(err)
			}
			keys := make([]string, 10_000)
			for i := range keys {
				keys[i] = fmt.Sprint("user:", i)
			}
			fwd0 := forwardedBy(nodes)
			cpu0 := processCPU()
			b.ReportAllocs()
			b.SetParallelism(25) // 50 callers on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					i = (i + 7919) % len(keys)
					res, err := c.Check(ctx, client.Request{Name: "bench", Key: keys[i], Limit: 1 << 40, Window: time.Minute})
					if err != nil || !res.Allowed {
						b.Errorf("check: %+v, %v", res, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(forwardedBy(nodes)-fwd0)/float64(b.N), "forwards/op")
		})
	}
}

func forwardedBy(nodes []*cluster.Node) (n uint64) {
	for _, nd := range nodes {
		n += nd.Status().Forwarded
	}
	return n
}
