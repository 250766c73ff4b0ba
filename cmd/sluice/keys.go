package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster/hitters"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport"
)

const keysUsage = `usage:
  sluice keys top [--by admitted|refused] [--limit 20] [--json] [--addr ADDR]
  sluice keys inspect --name N --key K [limit flags as for check] [--json] [--addr ADDR]
  sluice keys drain   --name N --key K [limit flags as for check] [--json] [--addr ADDR]
  sluice keys reset   --name N --key K [limit flags as for check] [--json] [--addr ADDR]`

// keysCmd is `sluice keys SUBCOMMAND`: top, inspect, drain, reset.
func keysCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(keysUsage)
	}
	switch args[0] {
	case "top":
		return keysTop(ctx, args[1:], stdout, stderr)
	case "inspect", "drain", "reset":
		return keysOne(ctx, args[0], args[1:], stdout, stderr)
	}
	return fmt.Errorf("unknown keys command %q\n%s", args[0], keysUsage)
}

// keysOne is `sluice keys inspect|drain|reset`: the key and its limits as for
// `sluice check` (none: the rule for --name), one Admin call.
func keysOne(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("sluice keys "+cmd, "print the answer as protobuf JSON", "deadline of the call", stderr)
	var cf checkFlags
	cf.register(a.fs)
	if err := a.parse(args); err != nil {
		return err
	}
	set := a.visited()
	if !set["name"] || !set["key"] {
		return errors.New("--name and --key are required")
	}
	req, err := cf.request(set)
	if err != nil {
		return err
	}
	c, cctx, done, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	call := c.InspectKey
	switch cmd {
	case "drain":
		call = c.DrainKey
	case "reset":
		call = c.ResetKey
	}
	ins, err := call(cctx, &sluicev1.KeyRequest{Request: req})
	if err != nil {
		return fmt.Errorf("%s: %w", *a.addr, err)
	}
	if *a.asJSON {
		b, err := jsonOut.Marshal(ins)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	p := ins.GetPeek()
	word := "allowed"
	if p.GetStatus() != sluicev1.Status_STATUS_UNDER_LIMIT {
		word = "refused"
	}
	fmt.Fprintf(stdout, "key %q of %q\n", ins.Key, ins.Name)
	switch cmd {
	case "drain":
		fmt.Fprintf(stdout, "drained:  %d hits\n", ins.Drained)
	case "reset":
		fmt.Fprintln(stdout, "reset:    the key's counts are forgotten")
	}
	fmt.Fprintf(stdout, "a check:  %s, %d of %d remaining, full again in %s (decided by %s)\n", word, p.GetRemaining(), p.GetLimit(),
		ms(p.GetResetAfterMs()), p.GetOwner())
	for i, l := range ins.Limits {
		word := "limit:   "
		if len(ins.Limits) > 1 {
			word = fmt.Sprintf("limit %d: ", i+1)
		}
		fmt.Fprintf(stdout, "%s %d per %s, %s\n", word, l.Limit, time.Duration(l.WindowMs)*time.Millisecond, algorithmName(l.Algorithm))
	}
	fmt.Fprintf(stdout, "owner:    %s\nreplicas: %v\n", ins.Owner, ins.Replicas)
	if len(ins.Versions) == 0 {
		fmt.Fprintln(stdout, "versions: unknown (the owner did not answer)")
	} else {
		fmt.Fprintf(stdout, "versions: %v (0: no record)\n", ins.Versions)
	}
	return nil
}

// adminCmd is what every Admin command shares: its flag set with --addr,
// --json, --timeout and the client security flags, and the connection.
type adminCmd struct {
	fs      *flag.FlagSet
	addr    *string
	asJSON  *bool
	timeout *time.Duration
	sec     clientFlags
}

// newAdminCmd makes the flag set of the command name; the caller adds the
// command's own flags to a.fs before parse.
func newAdminCmd(name, jsonHelp, timeoutHelp string, stderr io.Writer) *adminCmd {
	a := &adminCmd{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	a.fs.SetOutput(stderr)
	a.addr = a.fs.String("addr", "127.0.0.1:8081", "gRPC address of any node")
	a.asJSON = a.fs.Bool("json", false, jsonHelp)
	a.timeout = a.fs.Duration("timeout", 5*time.Second, timeoutHelp)
	a.sec.register(a.fs, true)
	return a
}

// parse reads args (and the environment) into the flags; arguments other
// than flags are refused.
func (a *adminCmd) parse(args []string) error {
	if err := parseWithEnv(a.fs, args); err != nil {
		return err
	}
	if a.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", a.fs.Arg(0))
	}
	return nil
}

// visited returns the names of the flags the command line set.
func (a *adminCmd) visited() map[string]bool {
	set := map[string]bool{}
	a.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// connect dials --addr and returns ctx bounded by --timeout; done closes
// the connection and ends the context.
func (a *adminCmd) connect(ctx context.Context) (c *client.Node, cctx context.Context, done func(), err error) {
	c, _, err = a.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, *a.timeout)
	return c, cctx, func() { cancel(); c.Close() }, nil
}

// dial connects to --addr for Admin calls, with the TLS or gossip-key
// proofs of the security flags, and returns the dial options for the
// other members too.
func (a *adminCmd) dial() (*client.Node, []grpc.DialOption, error) {
	opts, err := a.sec.dialOptions()
	if err != nil {
		return nil, nil, err
	}
	c, err := client.Dial(*a.addr, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", *a.addr, err)
	}
	return c, opts, nil
}

// topKey is one line of `sluice keys top --json`.
type topKey struct {
	Name     string `json:"name"`
	Key      string `json:"key"`
	Admitted int64  `json:"admitted"`
	Refused  int64  `json:"refused"`
}

// keysTop asks every alive member (as the node at --addr sees them) for
// its heaviest keys and prints the merge: a key's hits on every node
// added, the heaviest --limit by --by.
func keysTop(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	a := newAdminCmd("sluice keys top", "print a JSON array of {name, key, admitted, refused}", "deadline of each call", stderr)
	byName := a.fs.String("by", "admitted", "admitted|refused: the hits the keys are ranked by")
	limit := a.fs.Int("limit", transport.DefaultTopKeys, fmt.Sprintf("how many keys (1..%d)", transport.MaxTopKeys))
	if err := a.parse(args); err != nil {
		return err
	}
	var by sluicev1.TopBy
	var order hitters.By
	switch *byName {
	case "admitted":
	case "refused":
		by, order = sluicev1.TopBy_TOP_BY_REFUSED, hitters.ByRefused
	default:
		return fmt.Errorf("--by %q: want admitted or refused", *byName)
	}
	if *limit < 1 || *limit > transport.MaxTopKeys {
		return fmt.Errorf("--limit %d: want 1..%d", *limit, transport.MaxTopKeys)
	}
	c, opts, err := a.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, *a.timeout)
	st, err := c.Status(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%s: %w", *a.addr, err)
	}
	// Each key is decided by its owner, so each node's own top --limit
	// holds every key of the cluster's (stand-in decisions aside).
	type answer struct {
		member string
		resp   *sluicev1.TopKeysResponse
		err    error
	}
	var answers []answer
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range st.Members {
		if m.State != "alive" || m.GrpcAddr == "" {
			continue
		}
		wg.Go(func() {
			an := answer{member: m.Name}
			defer func() { mu.Lock(); answers = append(answers, an); mu.Unlock() }()
			mc, err := client.Dial(m.GrpcAddr, opts...)
			if err != nil {
				an.err = err
				return
			}
			defer mc.Close()
			cctx, cancel := context.WithTimeout(ctx, *a.timeout)
			defer cancel()
			an.resp, an.err = mc.TopKeys(cctx, &sluicev1.TopKeysRequest{By: by, Limit: int32(*limit)})
		})
	}
	wg.Wait()
	merged := map[[2]string]*hitters.Hitter{}
	answered := 0
	for _, an := range answers {
		if an.err != nil {
			fmt.Fprintf(stderr, "sluice keys top: %s did not answer (its keys are missing): %v\n", an.member, an.err)
			continue
		}
		answered++
		for _, k := range an.resp.Keys {
			h := merged[[2]string{k.Name, k.Key}]
			if h == nil {
				h = &hitters.Hitter{Name: k.Name, Key: k.Key}
				merged[[2]string{k.Name, k.Key}] = h
			}
			h.Admitted += k.Admitted
			h.Refused += k.Refused
			h.AdmittedError += k.AdmittedError
			h.RefusedError += k.RefusedError
		}
	}
	if answered == 0 {
		return fmt.Errorf("no member answered (%d asked)", len(answers))
	}
	list := make([]hitters.Hitter, 0, len(merged))
	for _, h := range merged {
		list = append(list, *h)
	}
	hitters.SortBy(list, order)
	list = list[:min(*limit, len(list))]
	if *a.asJSON {
		out := make([]topKey, len(list))
		for i, h := range list {
			out[i] = topKey{Name: h.Name, Key: h.Key, Admitted: h.Admitted, Refused: h.Refused}
		}
		b, err := json.Marshal(out)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	fmt.Fprintf(stdout, "the %d heaviest keys by %s hits in the last 30 to 60 s (%d of %d members answered)\n\n", len(list), *byName, answered, len(answers))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKEY\tADMITTED\tREFUSED")
	withErr := func(v, e int64) string {
		if e == 0 {
			return fmt.Sprint(v)
		}
		return fmt.Sprintf("%d (±%d)", v, e)
	}
	for _, h := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Name, h.Key, withErr(h.Admitted, h.AdmittedError), withErr(h.Refused, h.RefusedError))
	}
	return tw.Flush()
}
