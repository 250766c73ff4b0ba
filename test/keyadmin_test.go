package test

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"google.golang.org/protobuf/proto"
)

// TestInspectAndDrainAKeyOnThreeNodes: on three real nodes, `sluice keys
// inspect` shows what a check of the key would see (without counting),
// its owner and replica and the owner's record version; `sluice keys
// drain` consumes what remains, so that checks on every node refuse, is
// logged as an audit line on the node asked and counted in its metric;
// and once the key's owner is SIGKILLed the survivors still refuse it,
// because the drain reached the replica as any decision does.
func TestInspectAndDrainAKeyOnThreeNodes(t *testing.T) {
	t.Parallel()
	ps := startClusterAt(t, "127.0.0.33", 3)
	clients := clientsOf(t, ps)
	check := func(node int) *sluicev1.RateLimitResponse {
		return checkOne(t, clients[node], &sluicev1.RateLimitRequest{Name: "admin", Key: "k", Hits: proto.Int64(1), Limit: 10,
			WindowMs: 3_600_000, Algorithm: sluicev1.Algorithm_ALGORITHM_TOKEN_BUCKET})
	}
	for i := range 3 {
		check(i)
	}
	keyFlags := []string{"--name", "admin", "--key", "k", "--limit", "10", "--window", "1h", "--algorithm", "token_bucket", "--json"}
	type inspection struct {
		Peek struct {
			Status    string `json:"status"`
			Remaining string `json:"remaining"`
		} `json:"peek"`
		Owner    string   `json:"owner"`
		Replicas []string `json:"replicas"`
		Versions []string `json:"versions"`
		Drained  string   `json:"drained"`
		Limits   []struct {
			Algorithm string `json:"algorithm"`
			Limit     string `json:"limit"`
			WindowMS  string `json:"window_ms"`
		} `json:"limits"`
	}
	keys := func(node int, cmd string) inspection {
		t.Helper()
		out, code := runCLI(t, append([]string{"keys", cmd, "--addr", ps[node].grpc}, keyFlags...)...)
		if code != 0 {
			t.Fatalf("sluice keys %s on %s exited %d: %s", cmd, ps[node].name, code, out)
		}
		var ins inspection
		if err := json.Unmarshal([]byte(out), &ins); err != nil {
			t.Fatalf("sluice keys %s: %v in %q", cmd, err, out)
		}
		return ins
	}
	// Inspecting twice counts nothing: 7 of 10 remain both times.
	for range 2 {
		ins := keys(1, "inspect")
		if ins.Peek.Status != "STATUS_UNDER_LIMIT" || ins.Peek.Remaining != "7" || len(ins.Replicas) != 1 || ins.Owner == "" ||
			len(ins.Versions) != 1 || ins.Versions[0] == "0" || ins.Versions[0] == "" {
			t.Fatalf("inspect after 3 hits of 10: %+v, want 7 remaining, an owner, one replica and a record version", ins)
		}
		if len(ins.Limits) != 1 || ins.Limits[0].Algorithm != "ALGORITHM_TOKEN_BUCKET" || ins.Limits[0].Limit != "10" || ins.Limits[0].WindowMS != "3600000" {
			t.Fatalf("inspect: limits %+v, want the token bucket of 10 an hour", ins.Limits)
		}
	}

	ins := keys(2, "drain")
	if ins.Drained != "7" || ins.Peek.Remaining != "0" || ins.Peek.Status != "STATUS_OVER_LIMIT" {
		t.Fatalf("drain: %+v, want 7 drained and nothing remaining", ins)
	}
	for i := range ps {
		if r := check(i); r.Status != sluicev1.Status_STATUS_OVER_LIMIT {
			t.Fatalf("after the drain, %s admitted a check: %v", ps[i].name, r)
		}
	}
	// The node writes its log through a pipe: the line may reach the test
	// a moment after the answer.
	waitFor(t, 10*time.Second, "the drain's audit line in "+ps[2].name+"'s log", func() bool {
		return strings.Contains(ps[2].log.String(), `msg="audit: key drained" name=admin key=k caller="an unauthenticated caller (no TLS, no gossip key) from 127.0.0.1:`)
	})
	if v := metric(t, ps[2], `sluice_key_admin_total{result="drained"}`); v != 1 {
		t.Fatalf("sluice_key_admin_total{result=\"drained\"} on %s: %v, want 1", ps[2].name, v)
	}
	if v := metric(t, ps[1], `sluice_key_admin_total{result="inspected"}`); v != 2 {
		t.Fatalf("sluice_key_admin_total{result=\"inspected\"} on %s: %v, want 2", ps[1].name, v)
	}
	// An invalid key is refused with the check's error, and counted.
	if out, code := runCLI(t, "keys", "inspect", "--addr", ps[0].grpc, "--name", "admin", "--key", "k", "--limit", "-1", "--window", "1h"); code == 0 || !strings.Contains(out, "limit is -1") {
		t.Fatalf("inspect with limit -1: exit %d: %s", code, out)
	}

	// The owner dies once the drain is replicated and on disk: the
	// survivors refuse the key still.
	waitSettled(t, clients)
	victim := -1
	for i, p := range ps {
		if p.name == ins.Owner {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("owner %q is not one of the nodes", ins.Owner)
	}
	if err := ps[victim].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	for i := range ps {
		if i == victim {
			continue
		}
		if r := check(i); r.Status != sluicev1.Status_STATUS_OVER_LIMIT {
			t.Fatalf("after the owner %s was killed, %s admitted a check of the drained key: %v", ins.Owner, ps[i].name, r)
		}
	}
}

// TestResetAKeyOnThreeNodes: on three real nodes, `sluice keys reset`
// asked of a node that does not own a fixed-window key gives it its full
// quota again on every node; it is logged as an audit line and counted;
// a client's check cannot ask a reset; and once the owner is SIGKILLed,
// its replica admits exactly what the reset left after the hits counted
// since it, not the forgotten count, which a merge of the two copies of
// one window would keep (the larger count wins).
func TestResetAKeyOnThreeNodes(t *testing.T) {
	t.Parallel()
	ps := startClusterAt(t, "127.0.0.34", 3)
	clients := clientsOf(t, ps)
	const limit, after = 10, 4
	req := func(hits int64) *sluicev1.RateLimitRequest {
		return &sluicev1.RateLimitRequest{Name: "admin", Key: "r", Hits: proto.Int64(hits), Limit: limit,
			WindowMs: 3_600_000, Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW}
	}
	if r := checkOne(t, clients[0], req(limit)); r.Status != sluicev1.Status_STATUS_UNDER_LIMIT {
		t.Fatalf("the whole quota: %v", r)
	}
	for i := range ps {
		if r := checkOne(t, clients[i], req(1)); r.Status != sluicev1.Status_STATUS_OVER_LIMIT {
			t.Fatalf("%s admitted past the limit: %v", ps[i].name, r)
		}
	}
	owner := checkOne(t, clients[0], req(0)).Owner
	asked := -1
	for i, p := range ps {
		if p.name != owner {
			asked = i
		}
	}
	// A client's check cannot ask it.
	bad := req(0)
	bad.ResetKey = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := clients[asked].Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{bad}})
	if err != nil || !strings.Contains(resp.GetResponses()[0].GetError(), "Admin/ResetKey") {
		t.Fatalf("a client's check with reset_key: %v, %v", resp, err)
	}

	out, code := runCLI(t, "keys", "reset", "--addr", ps[asked].grpc, "--name", "admin", "--key", "r", "--limit", "10", "--window", "1h",
		"--algorithm", "fixed_window", "--json")
	if code != 0 {
		t.Fatalf("sluice keys reset on %s exited %d: %s", ps[asked].name, code, out)
	}
	var ins struct {
		Peek struct {
			Status    string `json:"status"`
			Remaining string `json:"remaining"`
		} `json:"peek"`
		Owner string `json:"owner"`
	}
	if err := json.Unmarshal([]byte(out), &ins); err != nil || ins.Peek.Status != "STATUS_UNDER_LIMIT" || ins.Peek.Remaining != "10" || ins.Owner != owner {
		t.Fatalf("sluice keys reset: %q (%v), want 10 remaining at owner %s", out, err, owner)
	}
	waitFor(t, 10*time.Second, "the reset's audit line in "+ps[asked].name+"'s log", func() bool {
		return strings.Contains(ps[asked].log.String(), `msg="audit: key reset" name=admin key=r caller="an unauthenticated caller (no TLS, no gossip key) from 127.0.0.1:`)
	})
	if v := metric(t, ps[asked], `sluice_key_admin_total{result="reset"}`); v != 1 {
		t.Fatalf("sluice_key_admin_total{result=\"reset\"} on %s: %v, want 1", ps[asked].name, v)
	}
	for i := range after {
		if r := checkOne(t, clients[i%len(ps)], req(1)); r.Status != sluicev1.Status_STATUS_UNDER_LIMIT || r.Remaining != int64(limit-1-i) {
			t.Fatalf("hit %d after the reset via %s: %v", i+1, ps[i%len(ps)].name, r)
		}
	}

	// The owner dies once the reset and the hits since are replicated.
	waitSettled(t, clients)
	victim := -1
	for i, p := range ps {
		if p.name == owner {
			victim = i
		}
	}
	if err := ps[victim].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	got := 0
	for range limit {
		if r := checkOne(t, clients[asked], req(1)); r.Status == sluicev1.Status_STATUS_UNDER_LIMIT {
			got++
		}
	}
	if got != limit-after {
		t.Fatalf("after the owner %s was killed: %d admitted, want exactly %d (%d of %d counted since the reset)", owner, got, limit-after, after, limit)
	}
}
