package test

// The gossip key without TLS: nodes authenticate each other's peer calls by
// proofs of the key; calls without a good proof are refused.

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/client"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/security"
)

// TestGossipKeyProofs runs three nodes that authenticate each other by the
// gossip key alone (no TLS): their own peer calls work, and a call without
// a proof, with a proof of another key, a stale one or a replayed one is
// refused and changes nothing; a node with another gossip key cannot join.
// Long on purpose: one story (a cluster by gossip key, then each bad proof).
func TestGossipKeyProofs(t *testing.T) {
	t.Parallel()
	const base, k = 34, 3
	key := gossipKey(t)
	ps := startNodes(t, k, base, func(int) []string { return []string{"--gossip-key-file", key} })
	waitMembersProof(t, ps, key)

	var clients []*client.Node
	for _, pr := range ps {
		clients = append(clients, dial(t, pr.grpc))
	}
	const limit = 10
	if got := spend(t, clients, "victim", 15, limit); got != limit {
		t.Fatalf("admitted %d of 15 through three nodes (forwards signed with the gossip key), want exactly %d", got, limit)
	}
	// The status page asks each member for its own figures with proofs.
	waitPageFigures(t, http.DefaultClient, "http://"+ps[0].http+"/", len(ps))

	right := prover(t, key)
	wrong := prover(t, gossipKey(t))
	peerRPC := sluicev1.NewPeerClient(clients[0].Conn())
	replicate := func(p *security.Prover, at time.Time, proof string) error {
		req := resetAttack(t, "victim")
		if p != nil {
			var err error
			if proof, err = p.Sign(at, "/sluice.v1.Peer/Replicate", req); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if proof != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, security.ProofHeader, proof)
		}
		_, err := peerRPC.Replicate(ctx, req)
		return err
	}
	for what, err := range map[string]error{
		"no proof":       replicate(nil, time.Time{}, ""),
		"another key":    replicate(wrong, time.Now(), ""),
		"a minute old":   replicate(right, time.Now().Add(-time.Minute), ""),
		"a minute early": replicate(right, time.Now().Add(time.Minute), ""),
		"malformed":      replicate(nil, time.Time{}, "v1:1:zz:zz"),
	} {
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("Peer/Replicate with %s: %v, want Unauthenticated", what, err)
		}
	}
	// A proof is good once: a valid, harmless call (a Pull without
	// release) goes through, the same proof again is refused.
	pull := &sluicev1.PullRequest{From: "node-x", Cluster: t.Name(), Keys: []*sluicev1.CounterKey{{Name: "sec", Key: "other"}}}
	proof, err := right.Sign(time.Now(), "/sluice.v1.Peer/Pull", pull)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []codes.Code{codes.OK, codes.Unauthenticated} {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), security.ProofHeader, proof), 5*time.Second)
		_, err := peerRPC.Pull(ctx, pull)
		cancel()
		if status.Code(err) != want {
			t.Errorf("Pull with a proof, use %d: %v, want %v", i+1, err, want)
		}
	}
	for i, c := range clients {
		if got := remaining(t, c, "victim", limit); got != 0 {
			t.Errorf("after the refused calls node %d says %d remain, want 0", i, got)
		}
	}
	if _, err := clients[0].Status(context.Background()); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Admin/Status without a proof: %v, want Unauthenticated", err)
	}

	// A fourth node with another gossip key cannot join, says so once, and
	// the cluster stays at three.
	x := newProc(t, 3, fmt.Sprintf("127.0.0.%d", base+3))
	x.join = []string{ps[0].gossip}
	x.extra = []string{"--gossip-key-file", gossipKey(t), "--join-retry", "100ms"}
	x.start(t)
	waitFor(t, 30*time.Second, "the fourth node has retried its join three times", func() bool {
		return countLines(x.log.String(), "join failed again") >= 3
	})
	if n := countLines(x.log.String(), "cannot join: the seeds do not share this node's gossip key"); n != 1 {
		t.Errorf("the wrong-key node said why it cannot join %d times, want once:\n%s", n, x.log.String())
	}
	st, err := dial(t, ps[1].grpc, security.WithProofs(right)).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	alive := 0
	for _, m := range st.Members {
		if m.Name == x.name {
			t.Errorf("the node with another gossip key is a member: %v", m)
		}
		if m.State == "alive" {
			alive++
		}
	}
	if alive != k {
		t.Errorf("%d members alive after the wrong-key node tried to join, want %d", alive, k)
	}
}

func prover(t *testing.T, keyFile string) *security.Prover {
	t.Helper()
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := security.NewProver([][]byte{k}, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitMembersProof is waitMembers for nodes whose Admin calls need a proof.
func waitMembersProof(t *testing.T, ps []*proc, keyFile string) {
	t.Helper()
	waitMembers(t, ps, security.WithProofs(prover(t, keyFile)))
}
