package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
)

// jsonOut prints protobuf messages as DESIGN §4 asks: proto field names,
// every field present.
var jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// Exit codes of `sluice check`.
const (
	exitAllowed = 0
	exitOver    = 1
	exitError   = 2
)

func check(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of any node")
	name := fs.String("name", "", "the limit's namespace, e.g. api.create_url")
	key := fs.String("key", "", "the entity, e.g. user:42")
	limit := fs.Int64("limit", 0, "hits allowed per window (0: the rule for --name)")
	window := fs.Duration("window", 0, "window length, e.g. 1m or 24h")
	hits := fs.Int64("hits", 1, "cost of this request; 0 peeks")
	burst := fs.Int64("burst", 0, "bucket capacity for token/leaky bucket and gcra (0: limit)")
	algorithm := fs.String("algorithm", "sliding_window", "sliding_window|sliding_log|token_bucket|leaky_bucket|fixed_window|gcra")
	asJSON := fs.Bool("json", false, "print the response as protobuf JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitAllowed
		}
		return exitError
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice check: "+format+"\n", a...)
		return exitError
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	alg, err := bucket.ParseAlgorithm(*algorithm)
	if err != nil {
		return fail("--algorithm: %v", err)
	}
	if *window < 0 || *window%time.Millisecond != 0 {
		return fail("--window %v: must be a positive whole number of milliseconds", *window)
	}
	req := &sluicev1.RateLimitRequest{
		Name: *name, Key: *key, Hits: *hits, Limit: *limit,
		WindowMs: window.Milliseconds(), Algorithm: sluicev1.Algorithm(alg), Burst: *burst,
	}
	c, err := transport.Dial(*addr)
	if err != nil {
		return fail("%s: %v", *addr, err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := c.Check(cctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{req}})
	if err != nil {
		return fail("%s: %v", *addr, err)
	}
	if len(resp.Responses) != 1 {
		return fail("%s answered %d responses to 1 request", *addr, len(resp.Responses))
	}
	r := resp.Responses[0]
	if *asJSON {
		b, err := jsonOut.Marshal(r)
		if err != nil {
			return fail("%v", err)
		}
		fmt.Fprintln(stdout, string(b))
	}
	switch {
	case r.Error != "":
		if !*asJSON {
			fmt.Fprintf(stderr, "sluice check: error: %s\n", r.Error)
		}
		return exitError
	case r.Status == sluicev1.Status_STATUS_UNDER_LIMIT:
		if !*asJSON {
			fmt.Fprintf(stdout, "allowed: %d of %d remaining, full again in %s (decided by %s)\n",
				r.Remaining, r.Limit, ms(r.ResetAfterMs), r.Owner)
		}
		return exitAllowed
	case r.Status == sluicev1.Status_STATUS_OVER_LIMIT:
		if !*asJSON {
			fmt.Fprintf(stdout, "over limit: %d of %d remaining, retry in %s (decided by %s)\n",
				r.Remaining, r.Limit, ms(r.RetryAfterMs), r.Owner)
		}
		return exitOver
	}
	return fail("%s answered status %v", *addr, r.Status)
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
