package clustertest

import (
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// A leaving node hands on only the keys it owned or replicated. A record
// of another key in its store is an old copy (the node held the key before
// a ring change took it away); pushed as a handoff, it reached a next
// owner that held nothing of the key yet, which took it as settled and
// decided from the old count (a 100-node rolling deploy lost 5 hits of
// one key this way, to a count of 2 with the newest version).
func TestLeaverHandsOnOnlyItsOwnKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(New(t, Options{}))
		r.Limit = 1000
		c := r.C
		names := []string{"n1", "n2", "n3", "n4", "n5"}
		for _, name := range names {
			if err := c.Add(name); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		tbl := c.Member("n1").Node.Ring().Table()
		// A key that n5 neither owns nor replicates, and that nobody
		// holds (never checked): n5 gets an old copy of it, as a node
		// that held it once keeps in its store.
		const old = 3
		var key, owner string
		for i := range 1000 {
			k := fmt.Sprint("k", i)
			reps := tbl.Replicas(ring.Hash(LimitName, k), nil)
			if !slices.ContainsFunc(reps, func(m ring.Member) bool { return m.Name == "n5" }) {
				key, owner = k, reps[0].Name
				break
			}
		}
		if key == "" {
			t.Fatal("every key has n5 among its replicas")
		}
		req := Request(key, r.Limit, old)
		var st bucket.State
		now := time.Now().UnixNano()
		bucket.Decide(&st, req.Limit, old, now)
		rec := writeback.Record{Key: writeback.Key{Name: LimitName, Key: key}, State: st, Version: uint64(now)}
		// In its store only, as a record long flushed: a copy in its cache
		// would go to the key's replicas with the next replication round.
		if err := c.Member("n5").Store.Write([]writeback.Record{rec}); err != nil {
			t.Fatal(err)
		}
		if err := c.Leave("n5"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		o, err := c.Check(owner, key, r.Limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Limit - o.Remaining; got != 1 {
			t.Fatalf("%s (owner %s, never checked) holds %d after one hit: n5's old copy of %d was handed on when it left", key, owner, got, old)
		}
	})
}
