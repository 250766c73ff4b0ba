package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
)

// A client checks one hit for user 42 against 3 per minute, four times:
// the fourth is over the limit.
func ExampleNew() {
	addr, stop := startNode() // a node of this example; yours run elsewhere
	defer stop()

	c, err := client.New([]string{addr}, client.WithCallTimeout(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for range 4 {
		res, err := c.Check(context.Background(), client.Request{
			Name: "api", Key: "user:42", Limit: 3, Window: time.Minute, Algorithm: client.GCRA,
		})
		if err != nil {
			log.Fatal(err) // no node answered, or the request was invalid
		}
		fmt.Printf("allowed %v, %d remaining, decided by %s\n", res.Allowed, res.Remaining, res.Owner)
	}
	// Output:
	// allowed true, 2 remaining, decided by sluice-1
	// allowed true, 1 remaining, decided by sluice-1
	// allowed true, 0 remaining, decided by sluice-1
	// allowed false, 0 remaining, decided by sluice-1
}

// A client of three nodes, over TLS, that sends each check straight to
// its key's owner; a node that is down is skipped.
func ExampleNew_cluster() {
	c, err := client.New(
		[]string{"sluice-0:8081", "sluice-1:8081", "sluice-2:8081"},
		client.WithTLS(client.TLSFiles{CA: "ca.pem", Cert: "app.pem", Key: "app-key.pem"}),
		client.WithOwnerRouting(0),
		client.WithCallTimeout(200*time.Millisecond),
	)
	if err != nil {
		log.Fatal(err) // a TLS file could not be read
	}
	defer c.Close()
	res, err := c.Check(context.Background(), client.Request{Name: "api", Key: "user:42"}) // the rule for "api" on the nodes
	if err != nil {
		log.Fatal(err)
	}
	if !res.Allowed {
		fmt.Println("slow down for", res.RetryAfter)
	}
}

// A batch decides several keys in one call; an invalid item has its own
// error and does not fail the others.
func ExampleClient_CheckBatch() {
	addr, stop := startNode()
	defer stop()

	c, err := client.New([]string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	rs, err := c.CheckBatch(context.Background(), []client.Request{
		{Name: "upload", Key: "org:7", Hits: 5, Limit: 100, Window: time.Hour},
		{Name: "upload", Key: "", Hits: 5, Limit: 100, Window: time.Hour},
		{Name: "upload", Key: "org:8", Hits: 500, Limit: 100, Window: time.Hour},
	})
	if err != nil {
		log.Fatal(err) // the whole call failed
	}
	for _, r := range rs {
		var ie *client.ItemError
		if errors.As(r.Err, &ie) {
			fmt.Println("refused:", ie.Msg)
			continue
		}
		fmt.Printf("allowed %v, %d remaining\n", r.Allowed, r.Remaining)
	}
	// Output:
	// allowed true, 95 remaining
	// refused: key is empty
	// allowed false, 100 remaining
}

// HTTPMiddleware limits each caller, named by its API key, to 2 requests
// a minute; if Sluice is unreachable, requests are refused (503) instead
// of let through.
func ExampleHTTPMiddleware() {
	addr, stop := startNode()
	defer stop()

	c, err := client.New([]string{addr}, client.WithCallTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	limit := client.HTTPMiddleware(c, "api",
		func(r *http.Request) string { return r.Header.Get("X-Api-Key") },
		client.WithLimit(2, time.Minute, client.SlidingWindow, 0),
		client.WithFailurePolicy(client.FailClosed),
		client.WithErrorHandler(func(err error) { log.Printf("sluice: %v", err) }),
	)
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	srv := httptest.NewServer(limit(hello)) // http.ListenAndServe(":8080", limit(mux)) in a service
	defer srv.Close()

	for range 3 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		req.Header.Set("X-Api-Key", "key-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status, resp.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 OK "api";q=2;w=60
	// 200 OK "api";q=2;w=60
	// 429 Too Many Requests "api";q=2;w=60
}

// UnaryServerInterceptor limits each caller of a gRPC server, named by
// its x-user header, to 2 calls a minute with a token bucket; calls
// without the header are not limited. StreamServerInterceptor does the
// same for streams, once when each starts.
func ExampleUnaryServerInterceptor() {
	addr, stop := startNode()
	defer stop()

	c, err := client.New([]string{addr})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	user := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("x-user"); len(u) > 0 {
			return u[0]
		}
		return ""
	}
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(client.UnaryServerInterceptor(c, "rpc",
			func(ctx context.Context, method string, _ any) string { return user(ctx) },
			client.WithLimit(2, time.Minute, client.TokenBucket, 2))),
		grpc.StreamInterceptor(client.StreamServerInterceptor(c, "rpc-streams",
			func(ctx context.Context, method string) string { return user(ctx) },
			client.WithLimit(10, time.Minute, client.SlidingWindow, 0))),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer()) // your services here
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Stop()

	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-user", "u1")
	for range 3 {
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		fmt.Println(status.Code(err))
	}
	// Output:
	// OK
	// OK
	// ResourceExhausted
}
