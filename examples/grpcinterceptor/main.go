// Command grpcinterceptor is a gRPC server whose unary calls and streams
// are limited by Sluice per caller (the x-user metadata) and method, with
// a token bucket; a stream is checked once, when it opens. A refused call
// or stream fails with RESOURCE_EXHAUSTED, a google.rpc.RetryInfo detail
// and a retry-after header; calls without x-user are not limited. The server offers grpc.health.v1 as the service
// being limited, so any gRPC client can try it:
//
//	go run ./examples/grpcinterceptor -nodes 127.0.0.1:8081 -listen 127.0.0.1:9090 -limit 2
//	grpcurl -plaintext -H 'x-user: u1' 127.0.0.1:9090 grpc.health.v1.Health/Check   # third time: ResourceExhausted
//	grpcurl -plaintext -H 'x-user: u1' 127.0.0.1:9090 grpc.health.v1.Health/Watch   # a stream
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/client"
)

func main() {
	nodes := flag.String("nodes", "127.0.0.1:8081", "comma-separated gRPC addresses of Sluice nodes")
	listen := flag.String("listen", "127.0.0.1:9090", "address this gRPC server listens on")
	limit := flag.Int64("limit", 10, "calls per window, per caller and method (the token bucket's refill)")
	window := flag.Duration("window", time.Minute, "the limit's window")
	name := flag.String("name", "example.grpc", "the limit's name")
	flag.Parse()

	c, err := client.New(strings.Split(*nodes, ","), client.WithCallTimeout(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	key := func(ctx context.Context, method string) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return method + "|" + u[0]
		}
		return "" // not limited
	}
	opts := []client.MiddlewareOption{
		client.WithLimit(*limit, *window, client.TokenBucket, 0),
		client.WithErrorHandler(func(err error) { log.Printf("sluice: %v", err) }),
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(client.UnaryServerInterceptor(c, *name,
			func(ctx context.Context, method string, _ any) string { return key(ctx, method) }, opts...)),
		grpc.StreamInterceptor(client.StreamServerInterceptor(c, *name, key, opts...)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())

	l, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("listening on %s", l.Addr())
	log.Fatal(srv.Serve(l))
}
