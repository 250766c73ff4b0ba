package clustertest

import (
	"testing"
	"testing/synctest"
	"time"
)

// A partition that splits a 4-node cluster in two halves: once each side
// sees only itself, each keeps answering and enforces the limit on its own
// (sides × limit in all); healed, the rings merge, the rejoin is counted,
// and the key's newest version wins: it is at its limit everywhere.
func TestPartitionEachSideEnforcesThenMerges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, Options{})
		if err := c.AddMany("n1", "n2", "n3", "n4"); err != nil {
			t.Fatal(err)
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		sides := [][]string{{"n1", "n2"}, {"n3", "n4"}}
		if err := c.Partition(sides...); err != nil {
			t.Fatal(err)
		}
		start := time.Now() // the bubble's clock
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		t.Logf("partition: each side saw only itself after %v (simulated)", time.Since(start))
		const limit = 10
		total := 0
		for _, side := range sides {
			for i := range 15 {
				o, err := c.Check(side[i%2], "split", limit, 1)
				if err != nil {
					t.Fatalf("check during the partition: %v", err)
				}
				if o.Allowed() {
					total++
				}
			}
		}
		if total != len(sides)*limit {
			t.Fatalf("two sides admitted %d with limit %d, want %d each", total, limit, limit)
		}
		c.Heal()
		start = time.Now()
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		t.Logf("healed: every node saw all four after %v (simulated)", time.Since(start))
		var rejoins uint64
		for _, name := range c.Up() {
			rejoins += c.Member(name).Node.Status().Rejoins
		}
		if rejoins == 0 {
			t.Fatal("no rejoin counted after the heal")
		}
		for _, name := range c.Up() {
			o, err := c.Check(name, "split", limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if o.Allowed() {
				t.Fatalf("after the heal, %s admitted a hit: %+v, want over the limit", name, o)
			}
		}
	})
}
