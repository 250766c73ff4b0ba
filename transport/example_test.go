package transport_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
)

// A client of three nodes checks 1 hit for user 42 against 100 requests per
// minute; a node that is down is skipped.
func ExampleNewClient() {
	c, err := transport.NewClient(
		[]string{"sluice-0:8081", "sluice-1:8081", "sluice-2:8081"},
		transport.WithClientTLS(transport.ClientTLSFiles{CA: "ca.pem"}),
		transport.WithCallTimeout(200*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, err := c.Check(context.Background(), transport.CheckRequest{
		Name: "api", Key: "user:42", Limit: 100, Window: time.Minute, Algorithm: bucket.GCRA,
	})
	if err != nil {
		log.Fatal(err) // no node answered, or the request was invalid
	}
	if !res.Allowed {
		fmt.Println("slow down for", res.RetryAfter)
	}
}

// A batch decides several keys in one call; each result has its own Err.
func ExampleClusterClient_CheckBatch() {
	c, err := transport.NewClient([]string{"localhost:8081"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	rs, err := c.CheckBatch(context.Background(), []transport.CheckRequest{
		{Name: "api", Key: "user:42"}, // limit from the rule for "api"
		{Name: "upload", Key: "org:7", Hits: 5, Limit: 1000, Window: time.Hour},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range rs {
		fmt.Println(r) // "allowed: 95 of 1000 remaining (decided by sluice-1)"
	}
}

// HTTPMiddleware limits each caller, named by its API key, by the rule for
// "api" on the nodes; if Sluice is unreachable, requests are refused (503)
// instead of let through.
func ExampleHTTPMiddleware() {
	c, err := transport.NewClient([]string{"localhost:8081"}, transport.WithCallTimeout(100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	limit := transport.HTTPMiddleware(c, "api",
		func(r *http.Request) string { return r.Header.Get("X-Api-Key") },
		transport.WithFailurePolicy(transport.FailClosed),
		transport.WithErrorHandler(func(err error) { log.Printf("sluice: %v", err) }),
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	log.Fatal(http.ListenAndServe(":8080", limit(mux)))
}

// UnaryServerInterceptor limits each gRPC method per caller to 10 calls a
// second with a token bucket of 20; callers without an x-user header are
// not limited.
func ExampleUnaryServerInterceptor() {
	c, err := transport.NewClient([]string{"localhost:8081"})
	if err != nil {
		log.Fatal(err)
	}
	key := func(ctx context.Context, method string, _ any) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return method + "|" + u[0]
		}
		return ""
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(transport.UnaryServerInterceptor(c, "rpc", key,
		transport.WithLimit(10, time.Second, bucket.TokenBucket, 20))))
	// Register services on srv here.
	l, err := net.Listen("tcp", ":9090")
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(srv.Serve(l))
}
