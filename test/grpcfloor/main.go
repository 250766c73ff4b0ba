// Command grpcfloor is a gRPC server that answers sluice.v1.RateLimiter/Check
// with every request under its limit and does nothing else: no routing, no
// forward, no counter, no store. Driven by test/compare.sh as a peer
// (PEER_KIND=sluice), it measures what grpc-go itself costs per call on this
// machine with the same server options as a Sluice node, which bounds from
// below the CPU per check of any server built on grpc-go
// (docs/performance.md, "The floor under every grpc-go server").
//
//	go build -o /tmp/grpcfloor ./test/grpcfloor
//	/tmp/grpcfloor -addr 127.0.0.91:18081 &
//	PEER_KIND=sluice PEER_NAME=grpc-floor PEER_ADDR=127.0.0.91:18081 \
//	  PEER_PIDS=$! bash test/compare.sh 8
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/transport/peer"
	"google.golang.org/grpc"
)

type floor struct {
	sluicev1.UnimplementedRateLimiterServer
}

// Check answers every request under its limit with the whole limit left.
func (floor) Check(_ context.Context, r *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	out := &sluicev1.CheckResponse{Responses: make([]*sluicev1.RateLimitResponse, len(r.GetRequests()))}
	for i, q := range r.GetRequests() {
		out.Responses[i] = &sluicev1.RateLimitResponse{
			Status: sluicev1.Status_STATUS_UNDER_LIMIT, Limit: q.GetLimit(), Remaining: q.GetLimit(),
		}
	}
	return out, nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18081", "gRPC listen address")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpcfloor: %v\n", err)
		os.Exit(1)
	}
	// The window sizes and stream workers a Sluice node's server uses
	// (transport.NewServer); no interceptors, no TLS.
	s := grpc.NewServer(
		grpc.InitialWindowSize(peer.StreamWindowSize),
		grpc.InitialConnWindowSize(peer.ConnWindowSize),
		grpc.NumStreamWorkers(transport.DefaultStreamWorkers),
	)
	sluicev1.RegisterRateLimiterServer(s, floor{})
	if err := s.Serve(ln); err != nil {
		fmt.Fprintf(os.Stderr, "grpcfloor: %v\n", err)
		os.Exit(1)
	}
}
