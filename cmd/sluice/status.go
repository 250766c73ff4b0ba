package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/transport"
)

func status(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sluice status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of any node")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	c, err := transport.Dial(*addr)
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	st, err := c.Status(cctx)
	if err != nil {
		return fmt.Errorf("%s: %w", *addr, err)
	}
	if *asJSON {
		b, err := jsonOut.Marshal(st)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	fmt.Fprintf(stdout, "node %s: %d keys in cache, %.0f checks/s, %d partitions, %d copies of each key\n\n",
		st.Node, st.Keys, st.ChecksPerSecond, st.Partitions, st.ReplicationFactor)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tGRPC ADDRESS\tSTATE\tRING SHARE\tKEYS")
	for _, m := range st.Members {
		keys := "-"
		if m.Keys >= 0 {
			keys = fmt.Sprint(m.Keys)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f%%\t%s\n", m.Name, m.GrpcAddr, m.State, 100*m.Share, keys)
	}
	return tw.Flush()
}
