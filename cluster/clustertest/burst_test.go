package clustertest

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
)

// A burst of graceful leaves (a rolling update with maxSurge: several
// nodes stopped at once) hands every counter on, though a key's owner and
// its replica may leave together: nothing admitted is lost, before and
// after the nodes come back on their stores.
func TestBurstOfLeavesKeepsEveryCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRunner(New(t, Options{}))
		r.Limit = 1000
		c := r.C
		for i := 1; i <= 6; i++ {
			if err := c.Add(fmt.Sprintf("n%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		const keys, hits = 30, 5
		key := func(i int) string { return fmt.Sprintf("k%d", i) }
		for i := range keys {
			for range hits {
				if _, err := c.Check("n1", key(i), r.Limit, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		held := func(when string, want int64) {
			t.Helper()
			lost := 0
			for i := range keys {
				got, err := r.Held(key(i))
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if got != want {
					lost++
					t.Errorf("%s: %s holds %d, want %d", when, key(i), got, want)
				}
			}
			if lost > 0 {
				t.Logf("%s: %d of %d keys off", when, lost, keys)
			}
		}
		checkAll := func(via string) {
			t.Helper()
			for i := range keys {
				if _, err := c.Check(via, key(i), r.Limit, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A rolling restart first, with checks between: keys move and
		// come back, and nodes keep old copies of keys they no longer
		// hold on their stores.
		want := int64(hits)
		for _, name := range []string{"n2", "n3", "n4", "n5", "n6"} {
			if err := c.Leave(name); err != nil {
				t.Fatal(err)
			}
			checkAll("n1")
			if err := c.Restart(name); err != nil {
				t.Fatal(err)
			}
			if err := c.Settle(); err != nil {
				t.Fatal(err)
			}
			checkAll("n1")
			want += 2
		}
		held("after the rolling restart", want)
		burst := []string{"n2", "n3", "n4"}
		var wg sync.WaitGroup
		for _, name := range burst {
			wg.Go(func() {
				if err := c.Leave(name); err != nil {
					t.Errorf("leave %s: %v", name, err)
				}
			})
		}
		wg.Wait()
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		held("after the burst of leaves", want)
		checkAll("n1")
		want++
		for _, name := range burst {
			if err := c.Restart(name); err != nil {
				t.Fatal(err)
			}
		}
		checkAll("n5")
		want++
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		held("after the nodes came back", want)
	})
}
