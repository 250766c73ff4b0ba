package test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// A window this long never crosses its (epoch-aligned) edge during a test.
const longWindow = bucket.MaxWindowMS

// admitted sends n single-hit checks on one key, round-robin over the nodes,
// and returns how many were admitted, plus the hits the nodes hold in
// quota leases and have not spent (docs/leases.md): admitted by the key's
// owner, by nobody yet. Every answer must come from one node, the key's
// owner, or from the node asked (from a lease).
func admitted(t *testing.T, ps []*proc, name, key string, n int, limit int64) int {
	t.Helper()
	clients := make([]interface {
		Check(context.Context, *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error)
	}, len(ps))
	for i, p := range ps {
		clients[i] = dial(t, p.grpc)
	}
	ok := 0
	owners := map[string]bool{}
	for i := range n {
		p := ps[i%len(ps)]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := clients[i%len(ps)].Check(ctx, checkReq(name, key, 1, limit, longWindow))
		cancel()
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		r := resp.Responses[0]
		if r.Error != "" {
			t.Fatalf("check %d: item error %q", i, r.Error)
		}
		if r.Owner != p.name {
			owners[r.Owner] = true // decided by another node than the one asked
		}
		if r.Status == sluicev1.Status_STATUS_UNDER_LIMIT {
			ok++
		}
	}
	if len(owners) > 1 {
		t.Fatalf("one key was decided by %d nodes other than the ones asked: %v", len(owners), owners)
	}
	return ok
}

// unspentLeases returns the hits ps hold in quota leases and have not
// spent since they started: granted by owners, admitted by nobody yet.
// Hits a holder gave back when its lease ended, and the owner took back
// into the counter (lease_returned_hits), are not among them: the owner
// may admit them again. (Without them, a run slow enough for a lease to
// end mid-run failed: 100 admitted with 2 "unspent" that had come back.)
func unspentLeases(t *testing.T, ps []*proc) int {
	t.Helper()
	var n int64
	for _, p := range ps {
		st, err := dial(t, p.grpc).Status(context.Background())
		if err != nil {
			t.Fatalf("status of %s: %v", p.name, err)
		}
		n += st.LeaseGrantedHits - st.LeaseSpentHits - st.LeaseReturnedHits
	}
	return int(n)
}

func TestThreeProcessesAdmitExactlyTheLimitAndSurviveRestart(t *testing.T) {
	t.Parallel()
	ps := startCluster(t, 3)
	if got, unspent := admitted(t, ps, "api", "user:42", 300, 100), unspentLeases(t, ps); got != 100-unspent {
		t.Fatalf("3 processes admitted %d of 300 checks with limit 100 and %d leased hits unspent, want exactly %d", got, unspent, 100-unspent)
	}

	// Stop every node gracefully; each must exit 0.
	for _, p := range ps {
		if err := p.stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s exited with %v after SIGTERM", p.name, err)
		}
	}
	// Start them again on the same names, ports and data dirs.
	for _, p := range ps {
		p.start(t)
	}
	waitMembers(t, ps)
	if got := admitted(t, ps, "api", "user:42", 30, 100); got != 0 {
		t.Fatalf("after a restart of every node %d more checks were admitted, want 0 (count lost)", got)
	}
	// A different key is unaffected.
	if got := admitted(t, ps, "api", "user:43", 5, 100); got != 5 {
		t.Fatalf("fresh key admitted %d of 5", got)
	}

	// Stop the whole cluster at once, as `kill %1 %2 %3` or a deployment
	// scaled to zero does: still a graceful stop for every node, though
	// no member is left to hear the last one leave.
	for _, p := range ps {
		p.signal(t, syscall.SIGTERM)
	}
	for _, p := range ps {
		if err := p.wait(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Errorf("%s exited with %v after the whole cluster got SIGTERM at once", p.name, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, p := range ps {
		p.start(t)
	}
	waitMembers(t, ps)
	if got, unspent := admitted(t, ps, "api", "user:43", 100, 100), unspentLeases(t, ps); got != 95-unspent {
		t.Fatalf("after the whole cluster stopped at once and restarted, %d of 100 more checks were admitted with 5 of 100 used and %d leased hits unspent, want %d", got, unspent, 95-unspent)
	}
}

func runCLI(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(sluiceBinary(t), args...)
	var out strings.Builder
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.ExitCode()
	}
	t.Fatalf("sluice %v: %v", args, err)
	return "", -1
}

// Long on purpose: one story through the CLI (check, status, exit codes, /metrics).
func TestCLICheckAndStatus(t *testing.T) {
	t.Parallel()
	ps := startCluster(t, 3)
	base := []string{"check", "--addr", ps[1].grpc, "--name", "cli", "--key", "k", "--limit", "2", "--window", "8760h"}
	for i, want := range []int{0, 0, 1} {
		out, code := runCLI(t, base...)
		if code != want {
			t.Fatalf("check %d exited %d, want %d: %s", i, code, want, out)
		}
	}
	out, code := runCLI(t, append(base, "--json")...)
	if code != 1 {
		t.Fatalf("--json over limit exited %d: %s", code, out)
	}
	var resp map[string]any
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("--json printed %q: %v", out, err)
	}
	for _, f := range []string{"status", "limit", "remaining", "reset_after_ms", "retry_after_ms", "error", "owner"} {
		if _, ok := resp[f]; !ok {
			t.Fatalf("--json lacks %q: %s", f, out)
		}
	}
	if resp["status"] != "STATUS_OVER_LIMIT" {
		t.Fatalf("--json status %v", resp["status"])
	}

	// Bad input and no rule exit 2; an unreachable node exits 2.
	for _, args := range [][]string{
		{"check", "--addr", ps[0].grpc, "--name", "", "--key", "k", "--limit", "2", "--window", "1m"},
		{"check", "--addr", ps[0].grpc, "--name", "norule", "--key", "k"},
		{"check", "--addr", ps[0].grpc, "--name", "x", "--key", "k", "--limit", "2", "--window", "1m", "--hits", "-1"},
		{"check", "--addr", ps[0].grpc, "--name", "x", "--key", "k", "--limit", "2", "--window", "1m", "--algorithm", "nope"},
		{"check", "--addr", "127.0.0.1:1", "--name", "x", "--key", "k", "--limit", "2", "--window", "1m", "--timeout", "2s"},
	} {
		if out, code := runCLI(t, args...); code != 2 {
			t.Fatalf("%v exited %d, want 2: %s", args, code, out)
		}
	}

	out, code = runCLI(t, "status", "--addr", ps[2].grpc, "--json")
	if code != 0 {
		t.Fatalf("status exited %d: %s", code, out)
	}
	var st struct {
		Members []struct {
			Name     string  `json:"name"`
			GRPCAddr string  `json:"grpc_addr"`
			State    string  `json:"state"`
			Share    float64 `json:"share"`
		} `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json printed %q: %v", out, err)
	}
	if len(st.Members) != 3 {
		t.Fatalf("status lists %d members: %s", len(st.Members), out)
	}
	sum := 0.0
	for i, m := range st.Members {
		if m.Name != ps[i].name || m.GRPCAddr != ps[i].grpc || m.State != "alive" || m.Share <= 0 {
			t.Fatalf("member %d: %+v", i, m)
		}
		sum += m.Share
	}
	if sum < 0.999 || sum > 1.001 {
		t.Fatalf("shares sum to %v", sum)
	}
	if out, code := runCLI(t, "status", "--addr", ps[0].grpc); code != 0 || !strings.Contains(out, ps[2].name) {
		t.Fatalf("status exited %d: %s", code, out)
	}

	// /metrics speaks the Prometheus text format and counts the checks.
	mresp, err := http.Get("http://" + ps[1].http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if mresp.StatusCode != 200 || !strings.Contains(string(body), "# TYPE sluice_checks_total counter") ||
		!strings.Contains(string(body), "sluice_members_alive 3") {
		t.Fatalf("/metrics answered %d:\n%s", mresp.StatusCode, body)
	}
}

// TestDuplicateNodeNameExits: a `sluice serve` whose --node-name a running
// member already has (two nodes started on one host without the flag get
// the host name) exits with code 2 and says which address has the name;
// the cluster keeps serving and still routes the name to the first process.
func TestDuplicateNodeNameExits(t *testing.T) {
	t.Parallel()
	ps := startCluster(t, 2)
	dup := newProc(t, 2, "127.0.0.12")
	dup.name = ps[1].name
	dup.join = []string{ps[0].gossip}
	dup.start(t)
	select {
	case <-dup.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate is still running")
	}
	var ee *exec.ExitError
	if !errors.As(dup.err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("duplicate exited with %v, want exit code 2", dup.err)
	}
	if out := dup.log.String(); !strings.Contains(out, "already used by the member at "+ps[1].gossip) {
		t.Fatalf("the duplicate's output does not name %s:\n%s", ps[1].gossip, out)
	}
	waitMembers(t, ps)
	c := dial(t, ps[0].grpc)
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.Name == ps[1].name && m.GrpcAddr != ps[1].grpc {
			t.Fatalf("%s is routed to %s, want %s", m.Name, m.GrpcAddr, ps[1].grpc)
		}
	}
	if got := admitted(t, ps, "dup", "k", 20, 10); got != 10 {
		t.Fatalf("admitted %d of 20 with limit 10 after the duplicate tried to join", got)
	}
}
