// Command baregrpc makes the call of testdata/hello with grpc and the
// generated sluicev1 package alone, no client: the floor that
// TestHelloWorldBinarySize measures the client's weight against.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

func main() {
	conn, err := grpc.NewClient("localhost:8081", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	hits := int64(1)
	resp, err := sluicev1.NewRateLimiterClient(conn).Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{
		{Name: "hello", Key: "world", Hits: &hits, Limit: 10, WindowMs: 60_000},
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(resp)
}
