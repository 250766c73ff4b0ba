package clustertest

import (
	"testing"
	"testing/synctest"
)

func TestSmoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(t, Options{})
		for _, n := range []string{"n1", "n2", "n3"} {
			if err := c.Add(n); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		admitted := 0
		for i := range 30 {
			o, err := c.Check(c.Up()[i%3], "k", 10, 1)
			if err != nil {
				t.Fatal(err)
			}
			if o.Allowed() {
				admitted++
			}
		}
		t.Logf("admitted %d", admitted)
	})
}
