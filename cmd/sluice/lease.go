package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// leaseCommand is `sluice acquire` and `sluice release`: one concurrency
// limit call. acquire exits 0 when it holds the lease, 1 when refused;
// release 0 when it ended the lease, 1 when the lease was not held; both
// 2 on an error.
func leaseCommand(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of any node")
	name := fs.String("name", "", "the limit's namespace, e.g. jobs.export")
	key := fs.String("key", "", "the entity, e.g. tenant:42")
	asJSON := fs.Bool("json", false, "print the answer as protobuf JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	var limit int64
	var ttl time.Duration
	var lease string
	if cmd == "acquire" {
		fs.Int64Var(&limit, "limit", 0, "the most holders of the key at once (1..10000)")
		fs.DurationVar(&ttl, "ttl", 0, "the lease's life without a renew (at most 24h)")
	} else {
		fs.StringVar(&lease, "lease", "", "the lease_id acquire printed")
	}
	var sec clientFlags
	sec.register(fs, false)
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice %s: "+format+"\n", append([]any{cmd}, a...)...)
		return exitError
	}
	if code, ok := parseCommand(fs, args, exitAllowed); !ok {
		return code
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	if *name == "" || *key == "" {
		return fail("--name and --key are required")
	}
	if ttl%time.Millisecond != 0 {
		return fail("--ttl %v: must be a whole number of milliseconds", ttl)
	}
	opts, err := sec.dialOptions()
	if err != nil {
		return fail("%v", err)
	}
	c, err := client.Dial(*addr, opts...)
	if err != nil {
		return fail("%s: %v", *addr, err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if cmd == "acquire" {
		resp, err := c.Acquire(cctx, &sluicev1.AcquireRequest{Name: *name, Key: *key, Limit: limit, TtlMs: ttl.Milliseconds()})
		if err != nil {
			return fail("%s: %v", *addr, err)
		}
		if *asJSON {
			if err := printJSON(stdout, resp); err != nil {
				return fail("%v", err)
			}
		}
		if !resp.Held {
			if !*asJSON {
				fmt.Fprintf(stdout, "refused: %d of %d held, retry in %s (decided by %s)\n", resp.Holders, resp.Limit, ms(resp.RetryAfterMs), resp.Owner)
			}
			return exitOver
		}
		if !*asJSON {
			fmt.Fprintf(stdout, "acquired: lease %s, %d of %d held, ends in %s without a renew (decided by %s)\n",
				resp.LeaseId, resp.Holders, resp.Limit, ms(resp.ExpiresInMs), resp.Owner)
		}
		return exitAllowed
	}
	if lease == "" {
		return fail("--lease is required")
	}
	resp, err := c.Release(cctx, &sluicev1.ReleaseRequest{Name: *name, Key: *key, LeaseId: lease})
	if err != nil {
		return fail("%s: %v", *addr, err)
	}
	if *asJSON {
		if err := printJSON(stdout, resp); err != nil {
			return fail("%v", err)
		}
	}
	if !resp.Released {
		if !*asJSON {
			fmt.Fprintf(stdout, "not held: lease %s had ended (released, or its TTL passed); %d held\n", lease, resp.Holders)
		}
		return exitOver
	}
	if !*asJSON {
		fmt.Fprintf(stdout, "released: lease %s; %d held\n", lease, resp.Holders)
	}
	return exitAllowed
}
