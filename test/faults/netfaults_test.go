//go:build faults && linux

package faults

// Network faults between the hosts, made with iptables and tc:
// partitions, one-way drops, loss, and throttled links; Heal removes them.

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// iptablesRestore loads rules into h's namespace (noflush: added to what is
// there).
func (h *Host) iptablesRestore(t *testing.T, rules string, noflush bool) {
	t.Helper()
	args := []string{"netns", "exec", h.NS, "iptables-restore", "-w"}
	if noflush {
		args = append(args, "--noflush")
	}
	if out, err := runErr([]byte(rules), "ip", args...); err != nil {
		t.Fatalf("iptables-restore in %s: %v\n%s\nrules:\n%s", h.NS, err, out, rules)
	}
}

// addRules appends rules ("-s 10.213.… -j DROP") to h's FAULTS chain at once.
func (h *Host) addRules(rules []string) {
	if len(rules) == 0 {
		return
	}
	var b strings.Builder
	b.WriteString("*filter\n")
	for _, r := range rules {
		b.WriteString("-A FAULTS " + r + "\n")
	}
	b.WriteString("COMMIT\n")
	h.iptablesRestore(h.c.t, b.String(), true)
}

// Partition cuts every host of one side from every host of the others, in
// both directions; hosts in no side keep their links. The test process (on
// the bridge) still reaches every host, as clients on both sides would.
func (c *Cluster) Partition(sides ...[]*Host) {
	c.t.Helper()
	side := map[*Host]int{}
	for i, s := range sides {
		for _, h := range s {
			side[h] = i + 1
		}
	}
	for h, sh := range side {
		var rules []string
		for o, so := range side {
			if so != sh {
				rules = append(rules, "-s "+o.IP+" -j DROP")
			}
		}
		h.addRules(rules)
	}
}

// DropFrom makes to deaf to from: every packet from from to to is dropped,
// while to's packets still reach from (one-way loss).
func (c *Cluster) DropFrom(to, from *Host) {
	c.t.Helper()
	to.addRules([]string{"-s " + from.IP + " -j DROP"})
}

// Lossy drops a random share (0..1) of the packets in and out of h,
// between hosts and with the test's clients alike.
func (c *Cluster) Lossy(h *Host, share float64) {
	c.t.Helper()
	h.addRules([]string{fmt.Sprintf("-m statistic --mode random --probability %.4f -j DROP", share)})
}

// Heal removes every network fault.
func (c *Cluster) Heal() {
	c.t.Helper()
	for _, h := range c.Hosts {
		h.iptablesRestore(c.t, "*filter\n-F FAULTS\nCOMMIT\n", true)
		c.Unthrottle(h)
	}
}

// throttleLatency is how long tbf lets a packet wait for tokens before it
// drops it.
const throttleLatency = "400ms"

// Throttle limits h's link to rateBits bits per second each way, with tc's
// token bucket filter (tbf) on both ends of its veth: burstBytes may pass at
// line rate, then packets wait for tokens (up to throttleLatency, then they
// are dropped). Unthrottle and Heal remove it. It skips the test where tc
// is missing.
func (c *Cluster) Throttle(h *Host, rateBits int64, burstBytes int) {
	c.t.Helper()
	if _, err := exec.LookPath("tc"); err != nil {
		c.t.Skipf("throttling needs tc: %v", err)
	}
	args := []string{"qdisc", "replace", "dev", "", "root", "tbf",
		"rate", fmt.Sprintf("%dbit", rateBits), "burst", strconv.Itoa(burstBytes), "latency", throttleLatency}
	args[3] = "eth0"
	run(c.t, "tc", append([]string{"-n", h.NS}, args...)...) // what h sends
	args[3] = fmt.Sprintf("v%d", h.Index)
	run(c.t, "tc", append([]string{"-n", c.brNS}, args...)...) // what h receives
	h.throttled = true
}

// Unthrottle removes Throttle's limits from h's link, if any.
func (c *Cluster) Unthrottle(h *Host) {
	c.t.Helper()
	if !h.throttled {
		return
	}
	run(c.t, "tc", "-n", h.NS, "qdisc", "del", "dev", "eth0", "root")
	run(c.t, "tc", "-n", c.brNS, "qdisc", "del", "dev", fmt.Sprintf("v%d", h.Index), "root")
	h.throttled = false
}
