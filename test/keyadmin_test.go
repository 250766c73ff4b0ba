package test

import (
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
