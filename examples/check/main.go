// Command check is the smallest program using Sluice's Go client: it checks
// one hit for a key against an inline limit, a few times, and prints each
// answer.
//
//	go run ./examples/check -nodes 127.0.0.1:8081 -key user:42 -limit 3 -n 5
//
// prints three "allowed" lines and then "over limit" lines; it exits 1 when
// the last check was over the limit and 2 on an error, like `sluice check`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
)

func main() {
	nodes := flag.String("nodes", "127.0.0.1:8081", "comma-separated gRPC addresses of Sluice nodes")
	name := flag.String("name", "example.check", "the limit's name")
	key := flag.String("key", "user:42", "the key to check")
	limit := flag.Int64("limit", 3, "hits allowed per window")
	window := flag.Duration("window", time.Minute, "the limit's window")
	n := flag.Int("n", 5, "number of checks to send (1 hit each)")
	flag.Parse()
	if err := run(strings.Split(*nodes, ","), *name, *key, *limit, *window, *n); err != nil {
		var over errOver
		if errors.As(err, &over) {
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "check:", err)
		os.Exit(2)
	}
}

// errOver is run's answer when the last check was refused.
type errOver struct{}

func (errOver) Error() string { return "over the limit" }

func run(nodes []string, name, key string, limit int64, window time.Duration, n int) error {
	// One client per program, shared by every goroutine: it spreads calls
	// over the nodes and retries on another when one is unavailable.
	c, err := client.New(nodes, client.WithCallTimeout(time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	var last client.Result
	for i := range n {
		last, err = c.Check(context.Background(), client.Request{
			Name: name, Key: key, Limit: limit, Window: window, Algorithm: client.SlidingWindow,
		})
		if err != nil {
			return fmt.Errorf("check %d of %d: %w", i+1, n, err)
		}
		fmt.Println(last) // "allowed: 2 of 3 remaining (decided by node-1)"
	}
	if !last.Allowed {
		return errOver{}
	}
	return nil
}
