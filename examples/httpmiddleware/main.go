// Command httpmiddleware is a net/http server whose requests are limited
// by Sluice per API key (the X-Api-Key header): an allowed request reaches
// the handler with the RateLimit-Policy and RateLimit headers set; a
// refused one is answered 429 Too Many Requests with those headers and
// Retry-After. Requests without the header are not limited.
//
//	go run ./examples/httpmiddleware -nodes 127.0.0.1:8081 -listen 127.0.0.1:9000 -limit 2
//	curl -i -H 'X-Api-Key: k1' http://127.0.0.1:9000/hello    # third time: 429
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/client"
)

func main() {
	nodes := flag.String("nodes", "127.0.0.1:8081", "comma-separated gRPC addresses of Sluice nodes")
	listen := flag.String("listen", "127.0.0.1:9000", "address this HTTP server listens on")
	limit := flag.Int64("limit", 10, "requests per window and API key; 0 takes the rule for -name from the nodes")
	window := flag.Duration("window", time.Minute, "the limit's window")
	name := flag.String("name", "example.http", "the limit's name")
	flag.Parse()

	c, err := client.New(strings.Split(*nodes, ","), client.WithCallTimeout(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	opts := []client.MiddlewareOption{
		// If Sluice cannot answer, let requests through (the default,
		// FailOpen) and log why; client.FailClosed answers 503 instead.
		client.WithErrorHandler(func(err error) { log.Printf("sluice: %v", err) }),
	}
	if *limit > 0 {
		opts = append(opts, client.WithLimit(*limit, *window, client.SlidingWindow, 0))
	}
	limited := client.HTTPMiddleware(c, *name,
		func(r *http.Request) string { return r.Header.Get("X-Api-Key") }, opts...)

	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })
	srv := &http.Server{Addr: *listen, Handler: limited(mux), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("listening on %s", *listen)
	log.Fatal(srv.ListenAndServe())
}
