package clustertest

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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

// Seeded gossip: packets sent at the same moment to one transport arrive
// one after another within the spread, in an order the seed fixes whatever
// order the senders ran in (another seed may give another); the two ends
// of a stream read what the other wrote at different moments.
func TestSeededGossipOrdersSimultaneousPackets(t *testing.T) {
	t.Parallel()
	const senders, seeds = 5, 20
	order := func(seed uint64) string {
		var got []string
		synctest.Test(t, func(t *testing.T) {
			g := NewGossipNetwork()
			g.SeedDelivery(seed, time.Millisecond)
			r := g.Transport(g.NewAddr())
			start := time.Now()
			var wg sync.WaitGroup
			for i := range senders {
				s := g.Transport(g.NewAddr())
				wg.Go(func() {
					if _, err := s.WriteTo([]byte(fmt.Sprint("from ", i)), r.Addr()); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			var last time.Time
			for range senders {
				p := <-r.PacketCh()
				if d := time.Since(start); d < 0 || d >= time.Millisecond || (!last.IsZero() && !time.Now().After(last)) {
					t.Errorf("packet %q at +%v: want each within the spread, one after another", p.Buf, d)
				}
				last = time.Now()
				got = append(got, string(p.Buf))
			}

			// A stream: each end's read of the other's write comes at a
			// moment of its own.
			s := g.Transport(g.NewAddr())
			dialed, err := s.DialTimeout(r.Addr(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			accepted := <-r.StreamCh()
			readAt := make(chan time.Time, 1)
			go func() {
				b := make([]byte, 4)
				if _, err := io.ReadFull(accepted, b); err != nil {
					t.Error(err)
				}
				readAt <- time.Now()
				if _, err := accepted.Write([]byte("pong")); err != nil {
					t.Error(err)
				}
			}()
			if _, err := dialed.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			b := make([]byte, 4)
			if _, err := io.ReadFull(dialed, b); err != nil {
				t.Fatal(err)
			}
			if there, here := <-readAt, time.Now(); !here.After(there) {
				t.Errorf("the dialer read the answer at %v, the listener the question at %v: want the answer later", here, there)
			}
			dialed.Close()
			accepted.Close()
		})
		return strings.Join(got, ", ")
	}
	orders := map[string]bool{}
	for seed := uint64(1); seed <= seeds; seed++ {
		want := order(seed)
		for range 3 {
			if got := order(seed); got != want {
				t.Fatalf("seed %d: arrivals %s, then %s", seed, want, got)
			}
		}
		orders[want] = true
	}
	if len(orders) < 2 {
		t.Fatalf("%d seeds gave one order of arrival: %v", seeds, orders)
	}
	t.Logf("%d seeds, %d orders of %d simultaneous packets", seeds, len(orders), senders)
}

// Under seeded delivery a dial nobody answers (to a crashed member, or over
// a cut link) fails once its timeout has passed, plus the seed's hold
// (under the spread); a dial to a deaf member fails at once, and so does
// every failed dial without seeded delivery.
func TestUnansweredDialFailsAtItsTimeout(t *testing.T) {
	t.Parallel()
	const timeout, spread = 300 * time.Millisecond, time.Millisecond
	for _, seeded := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			g := NewGossipNetwork()
			if seeded {
				g.SeedDelivery(7, spread)
			}
			a, b, c, d := g.Transport(g.NewAddr()), g.Transport(g.NewAddr()), g.Transport(g.NewAddr()), g.Transport(g.NewAddr())
			g.Crash(b.Addr())
			g.Cut(a.Addr(), c.Addr())
			g.Deafen(d.Addr())
			for _, tc := range []struct {
				to     string
				what   string
				silent bool
			}{{b.Addr(), "a crashed member", true}, {c.Addr(), "a cut link", true}, {d.Addr(), "a deaf member", false}} {
				start := time.Now()
				conn, err := a.DialAddressTimeout(memberlist.Address{Addr: tc.to}, timeout)
				took := time.Since(start)
				if err == nil {
					conn.Close()
					t.Fatalf("seeded %v: a dial to %s succeeded", seeded, tc.what)
				}
				t.Logf("seeded %v: a dial to %s failed after %v: %v", seeded, tc.what, took, err)
				switch {
				case seeded && tc.silent && (took < timeout || took >= timeout+spread):
					t.Errorf("seeded: a dial to %s failed after %v, want from %v to under %v", tc.what, took, timeout, timeout+spread)
				case (!seeded || !tc.silent) && took != 0:
					t.Errorf("seeded %v: a dial to %s failed after %v, want at once", seeded, tc.what, took)
				}
			}
		})
	}
}

// packetKinds names the messages of a packet as memberlist frames them:
// behind a label and a CRC header, and inside a compound message.
func TestPacketKinds(t *testing.T) {
	t.Parallel()
	label := []byte{244, 3, 'a', 'b', 'c'}
	crc := []byte{12, 0, 0, 0, 0}
	compound := []byte{7, 2, 0, 2, 0, 1, 4, 'x', 3}
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{[]byte{0, 'p'}, "ping"},
		{append(append([]byte{}, label...), 2, 'a'), "ack"},
		{append(append(append([]byte{}, label...), crc...), 5), "dead"},
		{compound, "compound[alive,suspect]"},
		{[]byte{7, 2, 0, 9}, "compound[truncated]"},
		{[]byte{99}, "type-99"},
		{nil, "empty"},
	} {
		if got := packetKinds(tc.b); got != tc.want {
			t.Errorf("packetKinds(%v) = %q, want %q", tc.b, got, tc.want)
		}
	}
}
