package cluster

// Joining the gossip pool, retrying seeds, and entering the ring.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/cluster/ownership"
)

// Fatal delivers, once, the error that made the node give up for good
// after Start returned: a join retried in the background found this node's
// name taken by another member. The node then decides nothing (its checks
// get the error) and should be shut down.
func (n *Node) Fatal() <-chan error { return n.fatal }

// tryJoin joins through the seeds; it reports whether joining is over:
// joined, or refused because another live member has this node's name.
func (n *Node) tryJoin() bool {
	ml := n.ml.Load()
	targets, alone, err := joinTargets(n.cfg.Join, n.cfg.Resolve, n.cfg.BindPort, n.GossipAddr())
	if len(targets) == 0 {
		if alone {
			// Every seed is this node (the first pod behind a headless
			// Service): it is the cluster's first node.
			n.log.Info("the seeds name only this node: starting a cluster of its own", "seeds", strings.Join(n.cfg.Join, ","))
			n.enterRing()
			return true
		}
		n.logJoinFailure(err)
		return false
	}
	k, jerr := ml.Join(targets)
	if jerr != nil {
		err = errors.Join(err, jerr)
	}
	if other := n.deleg.nameConflict(); other != "" {
		n.refuseName(other)
		return true
	}
	if k > 0 && ml.NumMembers() < 2 {
		// A seed answered with a state naming no member, not even itself:
		// memberlist serves joins while Create is still setting the seed
		// up. Entering the ring now would make this node a cluster of its
		// own whose ready flag reaches nobody until the next full state
		// exchange; retry until a seed names its members.
		err = errors.Join(err, fmt.Errorf("contacted %d seed(s), but none named a member yet (still starting)", k))
		k = 0
	}
	if k > 0 {
		// Join has merged the seed's full membership (the callbacks ran):
		// this node now knows every member and can take its partitions.
		n.log.Info("joined cluster", "contacted", k, "members", ml.NumMembers())
		n.enterRing()
		return true
	}
	n.logJoinFailure(err)
	return false
}

// joinTargets expands the seeds into the gossip addresses to contact: a
// seed whose host is a name becomes one address per IP it resolves to. The
// node's own address (self) is left out, and alone reports that it was the
// only address the seeds named. err collects what could not be resolved.
func joinTargets(seeds []string, resolve func(string) ([]string, error), defaultPort int, self string) (targets []string, alone bool, err error) {
	seen := map[string]bool{}
	var errs []error
	for _, seed := range seeds {
		// memberlist accepts an optional "nodename/" prefix; keep it.
		prefix, hostport := "", seed
		if i := strings.Index(seed, "/"); i > 0 {
			prefix, hostport = seed[:i+1], seed[i+1:]
		}
		host, port, e := net.SplitHostPort(hostport)
		if e != nil {
			host, port = hostport, strconv.Itoa(defaultPort)
		}
		ips := []string{host}
		if net.ParseIP(host) == nil {
			if ips, e = resolve(host); e != nil {
				errs = append(errs, fmt.Errorf("resolving %s: %w", host, e))
				continue
			}
		}
		for _, ip := range ips {
			a := net.JoinHostPort(ip, port)
			switch {
			case a == self:
				alone = true
			case !seen[a]:
				seen[a] = true
				targets = append(targets, prefix+a)
			}
		}
	}
	if len(errs) > 0 {
		alone = false // an unresolved seed may be another node
	}
	return targets, alone && len(targets) == 0, errors.Join(errs...)
}

// lookupHost is Config.Resolve's default: the system resolver, which
// returns every A and AAAA record (memberlist's own lookup of a name asks
// the first nameserver for ANY over TCP first, which some servers refuse).
func lookupHost(host string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return net.DefaultResolver.LookupHost(ctx, host)
}

// logJoinFailure logs a failed join at warning level the first time and
// whenever the error changes, and at debug level while it repeats: a node
// that cannot join retries every JoinRetry, possibly for long. A gossip key
// mismatch is named as such.
func (n *Node) logJoinFailure(err error) {
	msg := fmt.Sprint(err)
	if msg == n.lastJoinErr {
		n.log.Debug("join failed again; retrying", "seeds", strings.Join(n.cfg.Join, ","), "err", err)
		return
	}
	n.lastJoinErr = msg
	if gossipKeyMismatch(msg) {
		n.log.Error("cannot join: the seeds do not share this node's gossip key (--gossip-key-file), or one side encrypts gossip and the other does not; retrying quietly",
			"seeds", strings.Join(n.cfg.Join, ","), "err", err)
		return
	}
	n.log.Warn("join failed; retrying", "seeds", strings.Join(n.cfg.Join, ","), "err", err)
}

// gossipKeyMismatch reports whether memberlist's error says the two sides'
// gossip encryption does not match.
func gossipKeyMismatch(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "decrypt") || strings.Contains(msg, "encryption is configured") ||
		strings.Contains(msg, "encryption is not configured")
}

// refuseName gives up joining: the member at other (gossip address) has
// this node's name, and memberlist keeps that member, so this node would
// decide keys nobody routes to it while the others decide them too. The
// node stops gossiping without announcing a leave (a leave under this name
// would remove the other member from every ring).
func (n *Node) refuseName(other string) {
	err := fmt.Errorf("cluster: node name %q is already used by the member at %s (gossip); "+
		"every node needs its own --node-name: this node does not join", n.name, other)
	n.leaveMu.Lock()
	n.refusedErr.Store(&err) // before the phase: refusal() reads it after
	_, ok := n.life.to(ownership.Refused)
	n.leaveMu.Unlock()
	if !ok {
		// Leave began meanwhile: the node is stopping and announces
		// nothing under this name but the leave it already started.
		n.log.Error("node name taken while leaving", "name", n.name, "other_gossip_addr", other)
		return
	}
	n.log.Error("node name taken; not joining", "name", n.name, "other_gossip_addr", other)
	n.fatal <- err
	if ml := n.ml.Load(); ml != nil {
		ml.Shutdown()
	}
}

func (n *Node) joinLoop() {
	n.every(n.cfg.JoinRetry, func(time.Time) bool { return !n.tryJoin() })
}

// every calls fn every d until fn returns false or the node stops, on a
// goroutine counted in n.wg by the caller.
func (n *Node) every(d time.Duration, fn func(now time.Time) bool) {
	defer n.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case now := <-t.C:
			if !fn(now) {
				return
			}
		}
	}
}

// reconnectLoop tries, every ReconnectInterval, to join the members that
// were declared dead (not those that left): memberlist does not look for
// them once they are dead, so without this the two sides of a healed
// partition would stay apart. A restarted or healed member answers and the
// gossip pools merge. With seeds given by name it also joins, at the same
// interval, what they resolve to that is not a member (joinUnknownSeeds).
// Without either there is nothing to look for: it sleeps until a member is
// declared dead.
func (n *Node) reconnectLoop() {
	defer n.wg.Done()
	named := len(namedSeeds(n.cfg.Join)) > 0
	whileWork(n.stop, n.deadWake, n.cfg.ReconnectInterval,
		func() bool { return named || n.anyDead() },
		func() {
			var addrs []string
			for _, m := range n.roster.all() {
				if m.state == StateDead && m.name != n.name {
					addrs = append(addrs, m.gossip)
				}
			}
			if len(addrs) > 0 && !n.leaving() {
				if k, _ := n.ml.Load().Join(addrs); k > 0 {
					n.log.Info("reached members declared dead", "members", k)
				}
			}
			if n.Ready() {
				n.joinUnknownSeeds()
			}
		})
}

// anyDead reports whether a member other than this node is declared dead.
func (n *Node) anyDead() bool {
	for _, m := range n.roster.all() {
		if m.state == StateDead && m.name != n.name {
			return true
		}
	}
	return false
}

// wakeReconnect is the delegate's onDead: the reconnect loop has a member
// to look for.
func (n *Node) wakeReconnect() {
	select {
	case n.deadWake <- struct{}{}:
	default: // already told
	}
}

// whileWork calls fn every d while work() holds, until stop closes. When
// work() does not hold it stops its ticker and waits on wake, which whoever
// makes work() hold signals after making it so (a non-blocking send on a
// channel of capacity 1): a wake sent while the loop was busy ends its next
// wait at once, which costs one look at work().
func whileWork(stop, wake <-chan struct{}, d time.Duration, work func() bool, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if !work() {
			t.Stop()
			select {
			case <-stop:
				return
			case <-wake:
			}
			t.Reset(d)
			continue
		}
		select {
		case <-stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// namedSeeds returns the seeds given by name rather than IP address.
func namedSeeds(join []string) []string {
	var named []string
	for _, s := range join {
		if h, _, err := net.SplitHostPort(s[strings.Index(s, "/")+1:]); err == nil && net.ParseIP(h) == nil {
			named = append(named, s)
		}
	}
	return named
}

// joinUnknownSeeds joins the addresses that seed names resolve to now and
// that are not members: nodes started together behind one DNS name may
// each have seen only itself and started a cluster of its own; this merges
// them, as a healed partition merges. Seeds given as IPs are left alone.
func (n *Node) joinUnknownSeeds() {
	named := namedSeeds(n.cfg.Join)
	if len(named) == 0 {
		return
	}
	targets, _, _ := joinTargets(named, n.cfg.Resolve, n.cfg.BindPort, n.GossipAddr())
	known := map[string]bool{}
	for _, m := range n.roster.all() {
		known[m.gossip] = true
	}
	var unknown []string
	for _, a := range targets {
		if !known[a[strings.Index(a, "/")+1:]] {
			unknown = append(unknown, a)
		}
	}
	if len(unknown) > 0 {
		if k, _ := n.ml.Load().Join(unknown); k > 0 {
			n.log.Info("joined nodes the seed names resolve to that were not members", "addrs", strings.Join(unknown, ","))
		}
	}
}

// PeerWaker is implemented by Peers that keep a connection per peer
// (peer.PeerClient): when a member comes back after a crash or a
// leave, its connection, possibly waiting out a reconnect backoff, is told
// to reconnect at once.
type PeerWaker interface {
	ResetBackoff(addr string)
}

// peerReturned wakes the connection to a member that is back.
func (n *Node) peerReturned(m memberInfo) {
	if pw, ok := n.peers.(PeerWaker); ok && m.metaErr == nil {
		pw.ResetBackoff(m.meta.grpcAddr)
	}
}

// errJoining answers checks a node gets before it has joined the cluster.
const errJoining = "node is joining the cluster and decides nothing yet; ask another node"

// enterRing announces that this node takes its partitions (metaReady) and
// puts it in its own ring: joining → ready. Keys that move to it are
// pulled from their previous owners, computed from the ring just before.
// A node that began leaving or was refused meanwhile stays out.
func (n *Node) enterRing() {
	n.rebuild() // the others' ring, without this node
	n.leaveMu.Lock()
	defer n.leaveMu.Unlock()
	if _, ok := n.life.to(ownership.Ready); !ok { // and into the ring
		return
	}
	n.deleg.setMeta(n.meta())
	if err := n.ml.Load().UpdateNode(n.cfg.LeaveTimeout); err != nil {
		n.log.Warn("ready flag not gossiped yet", "err", err)
	}
	n.rebuild()
}
