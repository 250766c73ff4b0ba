package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
)

func status(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("sluice status", "print the status as JSON", "deadline of the call", stderr)
	if err := a.parse(args); err != nil {
		return err
	}
	c, opts, err := a.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, *a.timeout)
	defer cancel()
	st, err := c.Status(cctx)
	if err != nil {
		return fmt.Errorf("%s: %w", *a.addr, err)
	}
	fillFromMembers(ctx, st, *a.timeout, opts)
	if *a.asJSON {
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
	fmt.Fprintln(tw, "MEMBER\tGRPC ADDRESS\tSTATE\tRING SHARE\tKEYS\tLEASED\tRULES\tVERSION\tSECURITY")
	hashes := map[string]bool{}
	for _, m := range st.Members {
		keys, leased := "-", "-"
		if m.Keys >= 0 {
			keys, leased = fmt.Sprint(m.Keys), fmt.Sprint(m.LeasedKeys)
		}
		hash := m.RulesHash
		if m.State == "alive" && m.Keys >= 0 {
			hashes[hash] = true
		}
		if hash == "" {
			hash = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f%%\t%s\t%s\t%s\t%s\t%s\n", m.Name, m.GrpcAddr, m.State, 100*m.Share, keys, leased, hash,
			transport.MemberVersion(m), transport.SecuritySummary(m))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(hashes) > 1 {
		fmt.Fprintln(stdout, "\nwarning: the members run different rules (RULES column)")
	}
	if st.Region != "" {
		fmt.Fprintf(stdout, "\nregion %s, as seen from %s: %d hits of global limits lent to other regions, %d checks decided from a fallback share\n",
			st.Region, st.Node, st.RegionLentHits, st.RegionFallbackChecks)
		tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REGION	CUT OFF	LAST ANSWER	ROUND TRIP	KEYS ASKED	HITS LENT	FAILED CALLS")
		for _, l := range st.RegionLinks {
			last := "never"
			if l.LastAnswerUnixMs > 0 {
				last = time.UnixMilli(l.LastAnswerUnixMs).UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%v\t%s\t%v\t%d\t%d\t%d\n", l.Region, l.Cut, last, time.Duration(l.RttMicros)*time.Microsecond, l.Asks, l.LentHits, l.FailedCalls)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// fillFromMembers asks every alive member for its own key count, rules
// hash, rate, replication lag and version, which only it knows; members
// that do not answer keep -1 and "".
func fillFromMembers(ctx context.Context, st *sluicev1.StatusResponse, timeout time.Duration, opts []grpc.DialOption) {
	var wg sync.WaitGroup
	for _, m := range st.Members {
		if m.State != "alive" || m.Keys >= 0 || m.GrpcAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(m.GrpcAddr, opts...)
			if err != nil {
				return
			}
			defer c.Close()
			cctx, cancel := context.WithTimeout(ctx, min(timeout, 2*time.Second))
			defer cancel()
			if own, err := c.Status(cctx); err == nil {
				m.Keys, m.RulesHash, m.LeasedKeys = own.Keys, own.RulesHash, own.LeasedKeys
				m.ChecksPerSecond, m.Unreplicated = own.ChecksPerSecond, own.Unreplicated
				m.Version = own.Version
			}
		}()
	}
	wg.Wait()
}
