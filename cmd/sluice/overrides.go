package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

const overridesUsage = `usage:
  sluice overrides set    --name N --key K [--prefix] --limit L --window W [limit flags as for check] [--note TEXT] [--json] [--addr ADDR]
  sluice overrides list   [--name N] [--json] [--addr ADDR]
  sluice overrides delete --name N --key K [--prefix] [--json] [--addr ADDR]`

// overridesCmd is `sluice overrides SUBCOMMAND`: set, list, delete.
func overridesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(overridesUsage)
	}
	switch args[0] {
	case "set":
		return overridesSet(ctx, args[1:], stdout, stderr)
	case "list":
		return overridesList(ctx, args[1:], stdout, stderr)
	case "delete":
		return overridesDelete(ctx, args[1:], stdout, stderr)
	}
	return fmt.Errorf("unknown overrides command %q\n%s", args[0], overridesUsage)
}

// overridesSet is `sluice overrides set`: the limits as `sluice check`
// takes them (--limit, --window, --algorithm, ..., --also), for --key, or
// with --prefix for every key of --name that starts with it.
func overridesSet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("sluice overrides set", "print the stored override as protobuf JSON", "deadline of the call", stderr)
	var cf checkFlags
	cf.register(a.fs)
	prefix := a.fs.Bool("prefix", false, "--key is a prefix: every key of --name that starts with it (\"\" for all)")
	note := a.fs.String("note", "", "why, for the next operator (at most 256 bytes)")
	if err := a.parse(args); err != nil {
		return err
	}
	set := a.visited()
	if !set["name"] || !set["key"] {
		return errors.New("--name and --key are required (--key \"\" --prefix for every key of the name)")
	}
	req, err := cf.request(set)
	if err != nil {
		return err
	}
	r := peer.RequestFromProto(req)
	o := &sluicev1.Override{Name: cf.name, Key: cf.key, Prefix: *prefix, Note: *note}
	if r.Limit.Limit != 0 {
		o.Limits = append(o.Limits, peer.LimitToProto(r.Limit))
	}
	for _, l := range r.More {
		o.Limits = append(o.Limits, peer.LimitToProto(l))
	}
	if len(o.Limits) == 0 {
		return errors.New("--limit (or --also) is required: an override gives its limits")
	}
	c, cctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	stored, err := c.SetOverride(cctx, &sluicev1.SetOverrideRequest{Override: o})
	if err != nil {
		return fmt.Errorf("%s: %w", *a.addr, err)
	}
	if *a.asJSON {
		return printJSON(stdout, stored)
	}
	fmt.Fprintf(stdout, "override of %s set (version %d); every node has it within about a second\n", target(stored.Name, stored.Key, stored.Prefix), stored.Version)
	return nil
}

func overridesList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("sluice overrides list", "print the list as protobuf JSON", "deadline of the call", stderr)
	name := a.fs.String("name", "", "only this name's overrides")
	if err := a.parse(args); err != nil {
		return err
	}
	c, cctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.ListOverrides(cctx, &sluicev1.ListOverridesRequest{Name: *name})
	if err != nil {
		return fmt.Errorf("%s: %w", *a.addr, err)
	}
	if *a.asJSON {
		return printJSON(stdout, resp)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKEY\tLIMITS\tSET BY\tSET AT\tNOTE")
	for _, o := range resp.Overrides {
		key := fmt.Sprintf("%q", o.Key)
		if o.Prefix {
			key += "*"
		}
		lims := ""
		for i, l := range o.Limits {
			if i > 0 {
				lims += ", "
			}
			lims += fmt.Sprintf("%d per %s %s", l.Limit, time.Duration(l.WindowMs)*time.Millisecond, algorithmName(l.Algorithm))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", o.Name, key, lims, o.SetBy, time.UnixMilli(o.SetAtUnixMs).UTC().Format(time.RFC3339), o.Note)
	}
	tw.Flush()
	fmt.Fprintf(stdout, "%d of at most %d overrides\n", len(resp.Overrides), resp.Max)
	return nil
}

func overridesDelete(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("sluice overrides delete", "print the answer as protobuf JSON", "deadline of the call", stderr)
	name := a.fs.String("name", "", "the override's name")
	key := a.fs.String("key", "", "the override's key, or its prefix with --prefix")
	prefix := a.fs.Bool("prefix", false, "--key is the override's prefix")
	if err := a.parse(args); err != nil {
		return err
	}
	set := a.visited()
	if !set["name"] || !set["key"] {
		return errors.New("--name and --key are required")
	}
	c, cctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.DeleteOverride(cctx, &sluicev1.DeleteOverrideRequest{Name: *name, Key: *key, Prefix: *prefix})
	if err != nil {
		return fmt.Errorf("%s: %w", *a.addr, err)
	}
	if *a.asJSON {
		return printJSON(stdout, resp)
	}
	if resp.Deleted {
		fmt.Fprintf(stdout, "override of %s deleted\n", target(*name, *key, *prefix))
	} else {
		fmt.Fprintf(stdout, "no override of %s in force\n", target(*name, *key, *prefix))
	}
	return nil
}

// printJSON prints m as protobuf JSON on one line.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := jsonOut.Marshal(m)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, string(b))
	return nil
}

func target(name, key string, prefix bool) string {
	if prefix {
		return fmt.Sprintf("%s keys %q*", name, key)
	}
	return fmt.Sprintf("%s key %q", name, key)
}

func algorithmName(a sluicev1.Algorithm) string {
	if a == sluicev1.Algorithm_ALGORITHM_UNSPECIFIED {
		return "sliding_window"
	}
	return peer.LimitFromProto(&sluicev1.Limit{Algorithm: a}).Algorithm.String()
}
