package test

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// TestOverridesOnThreeNodes: on three real nodes, `sluice overrides set`
// on one node puts a prefix's limit in force on every node (the time it
// took is printed), ahead of the limit the checks carry inline; a key's
// own override wins over the prefix's; a bad override is refused with an
// error naming the field; each change is an audit line and counted; the
// overrides survive a restart of every node, and the owner's SIGKILL; and
// a deletion ends one everywhere.
func TestOverridesOnThreeNodes(t *testing.T) {
	t.Parallel()
	ps := startClusterAt(t, "127.0.0.35", 3)
	clients := clientsOf(t, ps)
	check := func(node int, key string) *sluicev1.RateLimitResponse {
		return checkOne(t, clients[node], &sluicev1.RateLimitRequest{Name: "api", Key: key, Hits: proto.Int64(1), Limit: 100,
			WindowMs: 3_600_000, Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW})
	}
	admitted := func(node int, key string, n int) int {
		got := 0
		for range n {
			if check(node, key).Status == sluicev1.Status_STATUS_UNDER_LIMIT {
				got++
			}
		}
		return got
	}
	cli := func(node int, args ...string) (string, int) {
		return runCLI(t, append([]string{"overrides", args[0], "--addr", ps[node].grpc}, args[1:]...)...)
	}
	lim := []string{"--limit", "3", "--window", "1h", "--algorithm", "fixed_window"}
	out, code := cli(0, append([]string{"set", "--name", "api", "--key", "tenant:", "--prefix", "--note", "incident 7", "--json"}, lim...)...)
	if code != 0 {
		t.Fatalf("overrides set exited %d: %s", code, out)
	}
	set := time.Now()
	var stored struct {
		Version string `json:"version"`
		Origin  string `json:"origin"`
		SetBy   string `json:"set_by"`
	}
	if err := json.Unmarshal([]byte(out), &stored); err != nil || stored.Origin != ps[0].name || stored.Version == "" ||
		!strings.Contains(stored.SetBy, "unauthenticated caller") {
		t.Fatalf("overrides set: %q (%v)", out, err)
	}
	waitFor(t, 10*time.Second, "the override on every node", func() bool {
		for i := range ps {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			resp, err := clients[i].ListOverrides(ctx, &sluicev1.ListOverridesRequest{Name: "api"})
			cancel()
			if err != nil || len(resp.Overrides) != 1 {
				return false
			}
		}
		return true
	})
	t.Logf("the override was on every node %v after the set returned", time.Since(set).Round(time.Millisecond))
	for i := range ps {
		if got := admitted(i, "tenant:"+ps[i].name, 5); got != 3 {
			t.Fatalf("via %s: %d of 5 admitted, want the override's 3 (the checks carry 100)", ps[i].name, got)
		}
	}
	if out, code := cli(1, append([]string{"set", "--name", "api", "--key", "tenant:vip"}, "--limit", "5", "--window", "1h", "--algorithm", "fixed_window")...); code != 0 {
		t.Fatalf("overrides set of a key exited %d: %s", code, out)
	}
	waitFor(t, 10*time.Second, "the key's override on node 2", func() bool {
		out, code := cli(2, "list", "--json")
		return code == 0 && strings.Contains(out, `"tenant:vip"`)
	})
	if got := admitted(2, "tenant:vip", 7); got != 5 {
		t.Fatalf("tenant:vip: %d of 7 admitted, want its own override's 5", got)
	}
	// Refused, and nothing changes.
	for _, bad := range [][]string{
		{"set", "--name", "api", "--key", "x", "--limit", "-1", "--window", "1h"},
		{"set", "--name", "api", "--key", "x", "--window", "1h"},
		{"set", "--name", "", "--key", "x", "--limit", "5", "--window", "1h"},
	} {
		if out, code := cli(0, bad...); code == 0 || !(strings.Contains(out, "limit") || strings.Contains(out, "name")) {
			t.Fatalf("%v: exit %d: %s", bad, code, out)
		}
	}
	waitFor(t, 10*time.Second, "the audit lines in "+ps[0].name+"'s log", func() bool {
		l := ps[0].log.String()
		return strings.Contains(l, `msg="audit: override set" name=api key=tenant: prefix=true caller="an unauthenticated caller`) &&
			strings.Contains(l, `msg="audit: override refused"`)
	})
	if v := metric(t, ps[2], "sluice_overrides"); v != 2 {
		t.Fatalf("sluice_overrides on %s: %v, want 2", ps[2].name, v)
	}
	if v := metric(t, ps[0], `sluice_override_changes_total{result="set"}`); v != 1 {
		t.Fatalf("sluice_override_changes_total{result=\"set\"} on %s: %v, want 1", ps[0].name, v)
	}

	// Every node stops, then starts again on its data dir.
	for i := range ps {
		if err := ps[i].stop(t, syscall.SIGTERM, 30*time.Second); err != nil {
			t.Fatalf("%s: %v", ps[i].name, err)
		}
	}
	for i := range ps {
		ps[i].start(t)
	}
	waitMembers(t, ps)
	if got := admitted(1, "tenant:after-restart", 5); got != 3 {
		t.Fatalf("after every node restarted: %d of 5 admitted, want the override's 3", got)
	}
	// The owner of a key under the override is killed: the others keep
	// the override (and the count).
	owner := check(0, "tenant:killed").Owner
	waitSettled(t, clients) // the hit replicated: a crash loses what was not
	for i, p := range ps {
		if p.name == owner {
			if err := p.stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
				t.Fatal("SIGKILL: process exited cleanly")
			}
			other := (i + 1) % len(ps)
			if got := admitted(other, "tenant:killed", 5); got != 2 {
				t.Fatalf("after the owner's SIGKILL via %s: %d of 5 admitted, want the 2 the override left", ps[other].name, got)
			}
			break
		}
	}

	survivor := 0
	if ps[0].name == owner {
		survivor = 1
	}
	if out, code := cli(survivor, "delete", "--name", "api", "--key", "tenant:", "--prefix"); code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("overrides delete: exit %d: %s", code, out)
	}
	waitFor(t, 10*time.Second, "the deletion on the other survivor", func() bool {
		for i, p := range ps {
			if p.name == owner || i == survivor {
				continue
			}
			out, code := cli(i, "list", "--json")
			return code == 0 && !strings.Contains(out, `"tenant:"`) && strings.Contains(out, `"tenant:vip"`)
		}
		return false
	})
}
