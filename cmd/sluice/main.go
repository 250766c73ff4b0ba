// Command sluice is the Sluice rate limiter: one binary that runs a node
// (serve) and talks to one (check, status, bench).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	// The tz database, for calendar windows in a named zone (calendar_tz)
	// where the host has none, as in the FROM scratch image: package time
	// reads the host's first and falls back to this copy (about 450 KB).
	_ "time/tzdata"
)

const usage = `sluice: a peer-to-peer rate limiter cluster

Usage:
  sluice serve   [flags]   run a node (sluice serve -h for flags)
  sluice check   [flags]   send one check; exit 0 allowed, 1 over limit, 2 error
  sluice acquire [flags]   take a lease of a concurrency limit; exit 0 acquired, 1 refused, 2 error
  sluice release [flags]   end a lease; exit 0 released, 1 not held, 2 error
  sluice status  [flags]   show the cluster as one node sees it
  sluice keys top [flags]  the keys with the most admitted (or refused) hits, cluster-wide
  sluice keys inspect|drain|reset [flags]  what a key's check would see, and where it lives; drain its quota, or reset it
  sluice overrides set|list|delete [flags]  limits set at run time for a key or a key prefix, on every node
  sluice health  [flags]   probe a node's /healthz (or /readyz); exit 0 healthy, 1 not
  sluice wait    [flags]   wait until a node is ready (/readyz); exit 0 ready, 1 not in --timeout
  sluice bench   [flags]   generate load against a node and summarise it
  sluice keygen            print a new gossip key (for --gossip-key-file)
  sluice certs   [flags]   make a development CA, node and client certificates
  sluice rules check PATH  validate rules files or directories offline (both formats)
  sluice version           print the version, revision and Go version (also --version)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command and returns the process exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stderr)
	case "check":
		return checkCommand(ctx, args[1:], stdout, stderr)
	case "acquire", "release":
		return leaseCommand(ctx, args[0], args[1:], stdout, stderr)
	case "health":
		return health(ctx, args[1:], stdout, stderr)
	case "wait":
		return waitReady(ctx, args[1:], stdout, stderr)
	case "status":
		err = status(ctx, args[1:], stdout, stderr)
	case "keys":
		err = keysCmd(ctx, args[1:], stdout, stderr)
	case "overrides":
		err = overridesCmd(ctx, args[1:], stdout, stderr)
	case "bench":
		err = bench(ctx, args[1:], stdout, stderr)
	case "keygen":
		err = keygen(args[1:], stdout)
	case "certs":
		err = certs(args[1:], stdout, stderr)
	case "rules":
		err = rulesCmd(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		return printVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: %v\n", args[0], err)
		return 2
	}
	return 0
}
