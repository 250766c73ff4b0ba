//go:build faults && linux

package faults

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// inBridge runs f on a thread inside the bridge's namespace (the thread is
// never unlocked, so it ends with its goroutine and nothing else runs
// there); sockets f makes stay in that namespace.
func (c *Cluster) inBridge(f func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(c.brFD, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %v", c.brNS, err)
			return
		}
		f()
		errc <- nil
	}()
	return <-errc
}

// SlowLinks puts a Delayer (in the bridge's namespace, on the bridge's
// address) on every link between x and the other hosts, in both
// directions: in the sender's namespace, a DNAT rule sends its gRPC and
// gossip traffic (TCP and UDP) for the other host to a relay of its own,
// which passes it on and holds every piece for the Delayer's delay. Every
// node keeps its own address and advertises it; only the packets take the
// detour, and the replies come back through the same relay (conntrack
// undoes the DNAT), so every exchange between x and another node crosses
// the delay twice, once each way. Test clients reach every node directly.
//
// It must come before the nodes start: a DNAT rule applies to new
// connections and flows only. Partition and DropFrom match the peers'
// addresses, which relayed packets no longer carry (they come from the
// bridge's address): use Lossy on x instead.
func (c *Cluster) SlowLinks(x *Host) *Delayer {
	c.t.Helper()
	d := NewDelayer(c.inBridge)
	c.t.Cleanup(d.Close)
	br := c.subnet + "254"
	type route struct {
		proto string
		port  int
	}
	routes := []route{{"tcp", grpcPort}, {"tcp", gossipPort}, {"udp", gossipPort}}
	rules := map[*Host][]string{}
	for _, p := range c.Hosts {
		if p == x {
			continue
		}
		for _, pair := range [][2]*Host{{x, p}, {p, x}} {
			from, to := pair[0], pair[1]
			for _, r := range routes {
				target := fmt.Sprintf("%s:%d", to.IP, r.port)
				relay := d.TCP
				if r.proto == "udp" {
					relay = d.UDP
				}
				addr, err := relay(br+":0", target)
				if err != nil {
					c.t.Fatalf("relay %s %s→%s: %v", r.proto, from.Name, target, err)
				}
				rules[from] = append(rules[from], fmt.Sprintf("-A OUTPUT -d %s/32 -p %s --dport %d -j DNAT --to-destination %s",
					to.IP, r.proto, r.port, addr))
			}
		}
	}
	for h, rs := range rules {
		h.iptablesRestore(c.t, "*nat\n"+strings.Join(rs, "\n")+"\nCOMMIT\n", true)
	}
	return d
}

// TestLatencyAndLoss: one host's links to the others get 100 ms ± 50 ms of
// latency each way (the Delayer) and lose 5 % of their packets (Lossy, on
// client traffic too) for 20 s under load, with the default policy
// (serve). It prints the latency of the checks routed through that host
// (sent to it, or for a key it owns) and of the others, the forwards that
// failed or timed out, and the membership events; it fails on a check
// without a decision or past its deadline, and when the hosts do not
// answer every key alike after the heal.
// Long on purpose: one story (fault under load, heal), then its figures.
func TestLatencyAndLoss(t *testing.T) {
	const (
		fault        = 20 * time.Second
		base, jitter = 100 * time.Millisecond, 50 * time.Millisecond
		loss         = 0.05
		keys         = 100
		// A limit the load never reaches (at most 3 checks per key per
		// second for under a minute): every admitted hit should be in the
		// key's final count, which the test compares.
		limit = 100_000
		// 300 checks/s as in the other scenarios, from 16 callers: a
		// caller waits for each answer, and the slow ones take up to
		// two forward timeouts.
		workers, perWorker = 16, 18.75
	)
	c := New(t, 5)
	x := c.Hosts[4]
	d := c.SlowLinks(x)
	c.StartAll()

	l := NewLoad(c, keys, limit)
	owner := owners(t, l, c.Hosts[2])
	ld := startLoad(t, l, workers, perWorker, linkMaxCalls)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d warm-up calls", linkWarmUp), func() bool { return l.Calls() >= linkWarmUp })

	before := c.counters()
	faultAt := l.Since()
	d.SetDelay(base, jitter)
	c.Lossy(x, loss)
	hold(t, l, ld, faultAt, fault)
	healAt := l.Since()
	during := c.counters().since(before)
	d.SetDelay(0, 0)
	c.Heal()
	converge := c.WaitViews(60*time.Second, c.Hosts)
	moreCalls(t, l, 600) // 2 s of load after the heal
	ld.Stop(t)

	h := l.History()
	pre, in, post := phases(h, faultAt, healAt)
	var via, others []Answer
	for _, a := range in {
		if a.Entry == x.Index || owner[a.Key] == x.Name {
			via = append(via, a)
		} else {
			others = append(others, a)
		}
	}
	t.Logf("%s's links: %v ± %v each way and %.0f %% loss, from %v to %v, policy serve, forward timeout 250 ms",
		x.Name, base, jitter, loss*100, faultAt.Round(time.Millisecond), healAt.Round(time.Millisecond))
	t.Logf("before: %v", statsOf(pre))
	t.Logf("during, checks sent to %s or for a key it owns: %v", x.Name, statsOf(via))
	t.Logf("during, the other checks: %v", statsOf(others))
	t.Logf("during: %v", during)
	t.Logf("after the heal: %v; every host sees all five alive %v after it", statsOf(post), converge.Round(time.Millisecond))
	noHangs(t, h)
	settleAfter(t, c, l, healAt, owner)
	rem := agree(t, c, l)
	var lost, extra, lostKeys int
	for k, n := range admittedPerKey(h, keys) {
		count := int(limit - rem[k])
		if count < n {
			lost += n - count
			lostKeys++
		} else {
			extra += count - n
		}
	}
	// Both differences come only from forwards that failed or timed out
	// (no host stops or restarts here): a stand-in or the entry node then
	// decided the check from its own copy, which is not merged into the
	// owner's count (lost), or decided it again after the owner had
	// (extra, counted twice). Each failed forward explains at most one of
	// each; calls that failed would add to extra, and noHangs fails them.
	failedForwards := int(c.counters().forwardErrors)
	t.Logf("final counts against the admitted checks: %d admitted hits not in their key's count (on %d keys: decisions not merged into the owner's count), %d counted but not seen admitted (counted twice: a forward that timed out after its owner decided); bound for each: %d forwards failed or timed out in the run",
		lost, lostKeys, extra, failedForwards)
	if lost > failedForwards {
		t.Errorf("%d admitted hits missing from their keys' counts, more than the %d failed forwards that can explain them", lost, failedForwards)
	}
	if extra > failedForwards {
		t.Errorf("%d hits counted but never seen admitted, more than the %d failed forwards that can explain them", extra, failedForwards)
	}
	if len(via) == 0 || !slices.ContainsFunc(via, func(a Answer) bool { return a.Entry == x.Index }) {
		t.Errorf("no check went through %s during the fault", x.Name)
	}
}
