package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRulesCheckCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("rules:\n  - name: login\n    limits: [{limit: 5, window: 1m}]\n"), 0o644)
	os.WriteFile(bad, []byte("rules:\n  - name: login\n    limits: [{limit: 5, window: 0s}]\n"), 0o644)
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"rules"}, args...), &out, &errb)
		return out.String() + errb.String(), code
	}
	out, code := run("check", good, "../../deploy/examples/envoy/ratelimit-config.yaml")
	if code != 0 || !strings.Contains(out, good+": ok: 1 rules") || !strings.Contains(out, "envoy domains") {
		t.Errorf("good files: exit %d\n%s", code, out)
	}
	out, code = run("check", good, bad)
	if code != 2 || !strings.Contains(out, bad+":3:") || !strings.Contains(out, "1 of 2 refused") {
		t.Errorf("a bad file: exit %d, want 2 and its file:line:col\n%s", code, out)
	}
	if _, code := run("lint", good); code != 2 {
		t.Errorf("unknown rules subcommand: exit %d, want 2", code)
	}
}

// Every subcommand reads SLUICE_<FLAG> for a flag not on the command line
// (not parallel: it sets the process environment).
func TestEveryCommandReadsEnvironment(t *testing.T) {
	t.Setenv("SLUICE_ALGORITHM", "no_such_algorithm")
	t.Setenv("SLUICE_DAYS", "0")
	var out bytes.Buffer
	if code := run(context.Background(), []string{"check", "--name", "n", "--key", "k", "--limit", "1", "--window", "1s"}, &out, &out); code != 2 ||
		!strings.Contains(out.String(), "algorithm") {
		t.Errorf("check with SLUICE_ALGORITHM=no_such_algorithm: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"certs", "--out", t.TempDir()}, &out, &out); code != 2 || !strings.Contains(out.String(), "--days 0") {
		t.Errorf("certs with SLUICE_DAYS=0: exit %d\n%s", code, out.String())
	}
	out.Reset()
	t.Setenv("SLUICE_TIMEOUT", "forever")
	if code := run(context.Background(), []string{"status"}, &out, &out); code != 2 || !strings.Contains(out.String(), "SLUICE_TIMEOUT") {
		t.Errorf("status with SLUICE_TIMEOUT=forever: exit %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"bench"}, &out, &out); code != 2 || !strings.Contains(out.String(), "SLUICE_TIMEOUT") {
		t.Errorf("bench with SLUICE_TIMEOUT=forever: exit %d\n%s", code, out.String())
	}
}
