package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/transport/rules"
)

// rulesCmd is `sluice rules check FILE|DIR...`: it validates rules files
// offline, both formats, with the file:line:col errors `serve` logs, for CI
// pipelines. It prints one line per path checked; the exit code is 2 when
// any path is refused.
func rulesCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("usage: sluice rules check FILE|DIR [FILE|DIR...]")
	}
	fs := flag.NewFlagSet("sluice rules check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: sluice rules check FILE|DIR [FILE|DIR...]")
	}
	bad := 0
	for _, path := range fs.Args() {
		set, err := rules.Load(path)
		if err != nil {
			bad++
			fmt.Fprintf(stdout, "%s: refused: %v\n", path, err)
			continue
		}
		line := fmt.Sprintf("%s: ok: %d rules", path, set.Len())
		if ds := set.EnvoyDomains(); len(ds) > 0 {
			line += fmt.Sprintf(", envoy domains %s", strings.Join(ds, ", "))
		}
		fmt.Fprintf(stdout, "%s, hash %s\n", line, set.Hash())
	}
	if bad > 0 {
		return fmt.Errorf("%d of %d refused", bad, fs.NArg())
	}
	return nil
}
