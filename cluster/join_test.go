package cluster

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// loopbackPort returns a port free for TCP and UDP on each of the given
// loopback addresses (the whole 127.0.0.0/8 is local on Linux), so that
// several nodes can gossip on one port, as pods behind one DNS name do.
func loopbackPort(t *testing.T, hosts ...string) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			t.Skipf("cannot listen on %s: %v", hosts[0], err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		free := true
		for _, h := range hosts {
			a := net.JoinHostPort(h, strconv.Itoa(port))
			tl, err := net.Listen("tcp", a)
			if err != nil {
				free = false
				break
			}
			ul, err := net.ListenPacket("udp", a)
			tl.Close()
			if err != nil {
				free = false
				break
			}
			ul.Close()
		}
		if free {
			return port
		}
	}
	t.Skip("no port free on every loopback address")
	return 0
}

// nameResolver resolves name to addrs; every other name is unknown. Its
// first fails calls fail.
func nameResolver(name string, fails int32, addrs ...string) (func(string) ([]string, error), *atomic.Int32) {
	var calls atomic.Int32
	return func(host string) ([]string, error) {
		if calls.Add(1) <= fails {
			return nil, errors.New("temporary failure in name resolution")
		}
		if host != name {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return addrs, nil
	}, &calls
}

// TestJoinNameJoinsEveryAddress: a seed that is a DNS name stands for every
// address it resolves to. Two nodes that each started a cluster of their
// own answer on 127.0.0.2 and 127.0.0.3; a third node given only the name
// contacts both (the only way the first two can learn of each other),
// after a first resolution failed and was retried, and all three end in
// one ring.
func TestJoinNameJoinsEveryAddress(t *testing.T) {
	t.Parallel()
	const name = "sluice-headless.sluice.svc.cluster.local"
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	port := loopbackPort(t, hosts...)
	mem := NewMemNetwork()
	resolve, calls := nameResolver(name, 1, hosts[0], hosts[1])
	var nodes []*Node
	for i, h := range hosts {
		cfg := NodeConfig(t, "n"+strconv.Itoa(i), memAddr(i))
		cfg.BindAddr, cfg.BindPort = h, port
		cfg.Resolve = resolve
		seed := ""
		if i == 2 {
			seed = net.JoinHostPort(name, strconv.Itoa(port))
		}
		n := StartNode(t, cfg, mem.Peers(memAddr(i)), seed)
		mem.Register(memAddr(i), n)
		nodes = append(nodes, n)
	}
	WaitRings(t, nodes)
	if !nodes[2].Ready() {
		t.Fatal("the node that joined through the name is not ready")
	}
	if c := calls.Load(); c < 2 {
		t.Fatalf("the name was resolved %d times; the failed first try was not retried", c)
	}
}

// TestJoinNameOfOnlyThisNode: the first pod behind a headless Service finds
// only itself under the name: it starts a cluster of its own and is ready;
// a second node joining through the same name (now resolving to both)
// leaves its own address out and joins the first.
func TestJoinNameOfOnlyThisNode(t *testing.T) {
	t.Parallel()
	const name = "sluice-headless"
	hosts := []string{"127.0.0.5", "127.0.0.6"}
	port := loopbackPort(t, hosts...)
	mem := NewMemNetwork()
	var resolved atomic.Pointer[[]string]
	resolved.Store(&[]string{hosts[0]})
	resolve := func(h string) ([]string, error) { return *resolved.Load(), nil }
	seed := net.JoinHostPort(name, strconv.Itoa(port))

	cfg := NodeConfig(t, "n0", memAddr(0))
	cfg.BindAddr, cfg.BindPort, cfg.Resolve = hosts[0], port, resolve
	first := StartNode(t, cfg, mem.Peers(memAddr(0)), seed)
	mem.Register(memAddr(0), first)
	if !first.Ready() {
		t.Fatal("a node whose seeds name only itself is not ready after Start")
	}

	resolved.Store(&[]string{hosts[1], hosts[0]})
	cfg = NodeConfig(t, "n1", memAddr(1))
	cfg.BindAddr, cfg.BindPort, cfg.Resolve = hosts[1], port, resolve
	second := StartNode(t, cfg, mem.Peers(memAddr(1)), seed)
	mem.Register(memAddr(1), second)
	WaitRings(t, []*Node{first, second})
}

// TestJoinNamesMergeClustersStartedApart: nodes started together behind
// one name that each saw only itself (pods started in parallel before DNS
// listed the others) merge once the name lists them all.
func TestJoinNamesMergeClustersStartedApart(t *testing.T) {
	t.Parallel()
	const name = "sluice-headless"
	hosts := []string{"127.0.0.7", "127.0.0.8"}
	port := loopbackPort(t, hosts...)
	mem := NewMemNetwork()
	var nodes []*Node
	all := make(chan struct{})
	for i, h := range hosts {
		cfg := NodeConfig(t, "n"+strconv.Itoa(i), memAddr(i))
		cfg.BindAddr, cfg.BindPort = h, port
		cfg.ReconnectInterval = 50 * time.Millisecond
		cfg.Resolve = func(string) ([]string, error) {
			select {
			case <-all:
				return hosts, nil
			default:
				return []string{h}, nil
			}
		}
		n := StartNode(t, cfg, mem.Peers(memAddr(i)), net.JoinHostPort(name, strconv.Itoa(port)))
		mem.Register(memAddr(i), n)
		if n.Ring().Table().Len() != 1 || !n.Ready() {
			t.Fatalf("%s did not start a cluster of its own", n.Name())
		}
		nodes = append(nodes, n)
	}
	close(all)
	WaitRings(t, nodes)
}

func TestJoinTargets(t *testing.T) {
	t.Parallel()
	resolve, _ := nameResolver("svc.ns", 0, "10.0.0.1", "10.0.0.2", "10.0.0.3")
	cases := []struct {
		seeds   []string
		targets []string
		alone   bool
		err     bool
	}{
		{[]string{"svc.ns:7946"}, []string{"10.0.0.2:7946", "10.0.0.3:7946"}, false, false},
		{[]string{"svc.ns"}, []string{"10.0.0.2:7946", "10.0.0.3:7946"}, false, false},
		{[]string{"svc.ns:7000"}, []string{"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"}, false, false},
		{[]string{"10.0.0.1:7946"}, nil, true, false},
		{[]string{"10.0.0.1:7946", "10.0.0.9:7946", "svc.ns:7946"}, []string{"10.0.0.9:7946", "10.0.0.2:7946", "10.0.0.3:7946"}, false, false},
		{[]string{"n2/svc.ns:7946"}, []string{"n2/10.0.0.2:7946", "n2/10.0.0.3:7946"}, false, false},
		{[]string{"10.0.0.1:7946", "other.ns:7946"}, nil, false, true},
		{[]string{"other.ns:7946", "svc.ns:7946"}, []string{"10.0.0.2:7946", "10.0.0.3:7946"}, false, true},
	}
	for _, c := range cases {
		targets, alone, err := joinTargets(c.seeds, resolve, 7946, "10.0.0.1:7946")
		if !slices.Equal(targets, c.targets) || alone != c.alone || (err != nil) != c.err {
			t.Errorf("joinTargets(%q) = %q, alone %v, err %v; want %q, alone %v, err %v",
				c.seeds, targets, alone, err, c.targets, c.alone, c.err)
		}
	}
}

// holdAlive is a gossip transport that holds memberlist's Create between
// starting its listeners and putting its own node in its member list (the
// second call for its advertised address is made there): a joiner that
// reaches it then is answered with a state naming no member at all.
type holdAlive struct {
	*memberlist.NetTransport
	calls   atomic.Int32
	held    chan struct{} // closed when Create is held
	release chan struct{}
}

func (h *holdAlive) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if h.calls.Add(1) == 2 {
		close(h.held)
		<-h.release
	}
	return h.NetTransport.FinalAdvertiseAddr(ip, port)
}

// TestJoinThroughASeedNotYetAliveRetries: a seed that answers a join before
// it lists itself as a member (memberlist serves joins while Create is
// still setting up) tells the joiner of nobody. The join "succeeded", but
// the joiner knows no member: it must not enter the ring as a cluster of
// its own, where its ready flag reaches no one until the next full state
// exchange (tens of seconds), but retry until it learns the seed.
func TestJoinThroughASeedNotYetAliveRetries(t *testing.T) {
	t.Parallel()
	mem := NewMemNetwork()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	hold := &holdAlive{NetTransport: nt, held: make(chan struct{}), release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(hold.release)
		}
	}()
	scfg := NodeConfig(t, "seed", memAddr(0))
	scfg.Transport = hold
	scfg.AdvertiseAddr, scfg.AdvertisePort = "127.0.0.1", nt.GetAutoBindPort()
	seedAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(nt.GetAutoBindPort()))
	seedUp := make(chan *Node, 1)
	go func() {
		seed, err := New(scfg, mem.Peers(memAddr(0)))
		if err != nil {
			t.Error(err)
			seedUp <- nil
			return
		}
		if err := seed.Start(context.Background()); err != nil {
			t.Error(err)
			seedUp <- nil
			return
		}
		seedUp <- seed
	}()
	<-hold.held

	joiner := StartNode(t, NodeConfig(t, "joiner", memAddr(1)), mem.Peers(memAddr(1)), seedAddr)
	mem.Register(memAddr(1), joiner)
	if joiner.Ready() {
		t.Errorf("the joiner entered the ring alone (%d member known) after a seed told it of no member", joiner.ml.Load().NumMembers())
	}
	close(hold.release)
	released = true
	seed := <-seedUp
	if seed == nil {
		t.FailNow()
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		seed.Shutdown(ctx)
	})
	mem.Register(memAddr(0), seed)
	WaitRings(t, []*Node{seed, joiner})
}
