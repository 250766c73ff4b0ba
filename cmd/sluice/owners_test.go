package main

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/ring"
)

// TestOwnerKeyHashIsRingHash keeps the client's key hash (what
// client.OwnerHash names) equal to the one the nodes place keys with,
// for names and keys of every length on both sides of ring.Hash's
// short-key and stack-buffer paths.
func TestOwnerKeyHashIsRingHash(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		name := randBytes(rng, 1+rng.IntN(130))
		key := randBytes(rng, 1+rng.IntN(1100))
		if i < 300 {
			key = randBytes(rng, 1+i%140) // dense over the short lengths
		}
		if got, want := client.OwnerKeyHash(name, key), ring.Hash(name, key); got != want {
			t.Fatalf("name %q (%d B), key of %d B: client hash %x, ring %x", name, len(name), len(key), got, want)
		}
	}
}

func randBytes(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return string(b)
}

// TestOwnersResponseDescribesTheTable: every partition's owner in the
// answer is the table's, and the version follows the placement, not the
// order members were given in.
func TestOwnersResponseDescribesTheTable(t *testing.T) {
	t.Parallel()
	cfg := ring.DefaultConfig()
	ms := []ring.Member{{Name: "c", Addr: "10.0.0.3:8081"}, {Name: "a", Addr: "10.0.0.1:8081"}, {Name: "b", Addr: "10.0.0.2:8081"}}
	tbl, err := ring.BuildTable(cfg, ms)
	if err != nil {
		t.Fatal(err)
	}
	resp := ownersResponse("a", tbl)
	if resp.Hash != client.OwnerHash || resp.Partitions != int64(cfg.Partitions) || len(resp.Owners) != cfg.Partitions || len(resp.Members) != 3 {
		t.Fatalf("answer: hash %q, %d partitions, %d owners, %d members", resp.Hash, resp.Partitions, len(resp.Owners), len(resp.Members))
	}
	for p, o := range resp.Owners {
		m, _ := tbl.PartitionOwner(p)
		if got := resp.Members[o]; got.Name != m.Name || got.GrpcAddr != m.Addr {
			t.Fatalf("partition %d: answer says %s at %s, table %s at %s", p, got.Name, got.GrpcAddr, m.Name, m.Addr)
		}
	}
	same, _ := ring.BuildTable(cfg, []ring.Member{ms[2], ms[0], ms[1]})
	if v := ownersResponse("b", same).Version; v != resp.Version {
		t.Errorf("same members in another order: version %x, want %x", v, resp.Version)
	}
	for _, other := range [][]ring.Member{ms[:2], {ms[0], ms[1], {Name: "b", Addr: "10.0.0.9:8081"}}} {
		tb, _ := ring.BuildTable(cfg, other)
		if v := ownersResponse("a", tb).Version; v == resp.Version {
			t.Errorf("members %v: same version as %v", other, ms)
		}
	}
	empty, _ := ring.BuildTable(cfg, nil)
	if r := ownersResponse("a", empty); len(r.Owners) != 0 || len(r.Members) != 0 {
		t.Errorf("empty table: %d owners, %d members, want none", len(r.Owners), len(r.Members))
	}
}
