package clustertest

import (
	"testing"
	"testing/synctest"

	"github.com/hashicorp/memberlist"
)

// TestGossipSendsNeverBlock: packets to a transport nobody reads are lost
// once its queue is full, never blocking the sender; dials to a crashed or
// shut down transport fail at once.
func TestGossipSendsNeverBlock(t *testing.T) {
	t.Parallel()
	g := NewGossipNetwork()
	a, b := g.Transport(g.NewAddr()), g.Transport(g.NewAddr())
	for range packetQueue + 10 { // nobody reads b
		if _, err := a.WriteTo([]byte("x"), b.Addr()); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.packets); n != packetQueue {
		t.Fatalf("b holds %d packets, want a full queue of %d", n, packetQueue)
	}
	for range streamQueue {
		if _, err := a.DialTimeout(b.Addr(), 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.DialTimeout(b.Addr(), 0); err == nil {
		t.Fatal("dial to a full stream queue succeeded")
	}
	g.Crash(b.Addr())
	if _, err := a.DialTimeout(b.Addr(), 0); err == nil {
		t.Fatal("dial to a crashed transport succeeded")
	}
	b.Shutdown()
	if n := len(b.streams); n != 0 {
		t.Fatalf("shutdown left %d streams unclosed", n)
	}
}

// TestGossipCutAndCrash: a cut link loses what goes one way only; a crashed
// transport's packets reach nobody, and a transport restarted at its address
// receives again.
func TestGossipCutAndCrash(t *testing.T) {
	t.Parallel()
	g := NewGossipNetwork()
	a, b := g.Transport(g.NewAddr()), g.Transport(g.NewAddr())
	send := func(from, to *GossipTransport) {
		t.Helper()
		if _, err := from.WriteToAddress([]byte("x"), memberlist.Address{Addr: to.Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	g.Cut(a.Addr(), b.Addr())
	send(a, b)
	send(b, a)
	if len(b.packets) != 0 || len(a.packets) != 1 {
		t.Fatalf("cut a→b: b got %d, a got %d packets; want 0 and 1", len(b.packets), len(a.packets))
	}
	p := <-a.packets
	if p.From.String() != b.Addr() {
		t.Fatalf("packet from %s, want %s", p.From, b.Addr())
	}
	g.Heal()
	g.Crash(a.Addr())
	send(a, b)
	if len(b.packets) != 0 {
		t.Fatal("a crashed transport's packet arrived")
	}
	a2 := g.Transport(a.Addr())
	send(b, a2)
	send(a, b)
	if len(a2.packets) != 1 || len(b.packets) != 0 {
		t.Fatalf("after the restart: a2 got %d (want 1), b got %d from the crashed one (want 0)", len(a2.packets), len(b.packets))
	}
	a.Shutdown() // the crashed incarnation's shutdown leaves the new one in place
	send(b, a2)
	if len(a2.packets) != 2 {
		t.Fatal("the old transport's shutdown took the new one off the network")
	}
}

// TestClusterCrashedNodeIsDeclaredDead: in a bubble, the survivors of a
// crash drop the node from their rings within memberlist's detection time,
// with no wall-clock wait.
func TestClusterCrashedNodeIsDeclaredDead(t *testing.T) {
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
		if err := c.Crash("n2"); err != nil {
			t.Fatal(err)
		}
		if msg := c.settled(); msg == "" {
			t.Fatal("settled at the instant of the crash")
		}
		if err := c.Settle(); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"n1", "n3"} {
			if l := c.Member(n).Node.Ring().Table().Len(); l != 2 {
				t.Fatalf("%s's ring holds %d members, want 2", n, l)
			}
		}
	})
}
