package cluster

// The node's lifecycle: one phase (ownership.Phase), held atomically,
// changed only by lifecycle.to, which refuses every transition
// ownership.Legal does not allow. docs/ownership.md ("The node's
// lifecycle") uses the same names.

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/ownership"
)

// lifecycle holds a node's phase and whether the node is in its own ring
// (it takes partitions: ownership.Facts.InRing), in one word, so that the
// two are always read and changed together. The zero value is
// ownership.Starting, out of the ring.
//
// The ring bit follows the phase: a node enters its ring when it becomes
// Ready (enterRing), or from the start when it has no seeds (alone), and
// stays in it through Leaving and Draining until it has left. A node that
// leaves or is refused while joining never enters it.
type lifecycle struct {
	p atomic.Uint32 // the phase in the low byte; inRingBit
}

const (
	phaseMask = 0xff
	inRingBit = 1 << 8
)

// load returns the current phase.
func (l *lifecycle) load() ownership.Phase { return ownership.Phase(l.p.Load() & phaseMask) }

// inRing reports whether the node takes partitions in its own ring.
func (l *lifecycle) inRing() bool { return l.p.Load()&inRingBit != 0 }

// state returns the phase and whether the node is in its ring, read
// together.
func (l *lifecycle) state() (ownership.Phase, bool) {
	w := l.p.Load()
	return ownership.Phase(w & phaseMask), w&inRingBit != 0
}

// alone puts a node that has no seeds in its own ring before it starts: it
// is a cluster of its own from the start.
func (l *lifecycle) alone() { l.p.Or(inRingBit) }

// to moves the lifecycle to next when the current phase allows it,
// atomically, and reports the phase it was in and whether it moved. It is
// the only writer of the phase; moving to Ready also enters the ring.
func (l *lifecycle) to(next ownership.Phase) (from ownership.Phase, ok bool) {
	for {
		cur := l.p.Load()
		from = ownership.Phase(cur & phaseMask)
		if !ownership.Legal(from, next) {
			return from, false
		}
		w := cur&^phaseMask | uint32(next)
		if next == ownership.Ready {
			w |= inRingBit
		}
		if l.p.CompareAndSwap(cur, w) {
			return from, true
		}
	}
}

// Ready reports whether the node has started and, when it was given seeds,
// has joined through one of them, and is not leaving.
func (n *Node) Ready() bool { return n.life.load() == ownership.Ready }

// leaving reports whether Leave has begun, or the node was refused (the
// leave may still be being announced: the node then decides what nobody
// has pulled from it).
func (n *Node) leaving() bool {
	p := n.life.load()
	return p.Leaves() || p.Drains()
}

// draining reports whether the node has stopped deciding because it is
// leaving: it redirects every key to its next owner, pulls nothing and
// takes no handoff.
func (n *Node) draining() bool {
	return n.life.load().Drains()
}

// refusal returns the error the node was refused with, or nil.
func (n *Node) refusal() error {
	if n.life.load() != ownership.Refused {
		return nil
	}
	if p := n.refusedErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Start joins the gossip pool and starts the node's goroutines: the ring
// rebuild loop, the rate meter, the cache's flush and expiry loops and, when
// no seed answers at once, a join loop that retries every JoinRetry until
// one does or the node shuts down.
func (n *Node) Start(ctx context.Context) error {
	if from, ok := n.life.to(ownership.Joining); !ok {
		return fmt.Errorf("cluster: node cannot start: it is %s", from)
	}
	mc := *n.cfg.Config
	mc.Delegate = n.deleg
	mc.Events = n.deleg
	mc.Ping = n.deleg
	mc.Alive = n.deleg
	mc.Label = n.cfg.ClusterName
	mc.Conflict = n.deleg
	if mc.DeadNodeReclaimTime == 0 {
		// A member declared dead may come back under its name at another
		// address at once (a restarted container with a new IP): without
		// this memberlist ignores it until it forgets the dead member.
		mc.DeadNodeReclaimTime = time.Nanosecond
	}
	// memberlist's log goes to the node's logger (or where the config sent
	// it), through slogWriter, which also catches its suspicions.
	w := slogWriter{l: n.log, onSuspect: n.roster.suspected, quiet: &repeatFilter{now: n.now}}
	switch {
	case mc.Logger != nil:
		w.next = mc.Logger.Writer()
	case mc.LogOutput != nil:
		w.next = mc.LogOutput
	}
	mc.Logger, mc.LogOutput = log.New(w, "", 0), nil
	ml, err := memberlist.Create(&mc)
	if err != nil {
		return fmt.Errorf("cluster: gossip on %s:%d: %w", mc.BindAddr, mc.BindPort, err)
	}
	n.gossipAddr.Store(ml.LocalNode().Address()) // nothing updates it concurrently yet
	n.ml.Store(ml)
	n.rebuild()
	n.cache.Start(ctx)
	n.pause.mu.Lock()
	n.pause.evidence = openCPUEvidence()
	n.sampleCPU()
	n.pause.mu.Unlock()
	n.beat.last.Store(n.now().UnixNano())
	n.wg.Add(10)
	go n.saveLoop()
	if n.regions != nil {
		n.wg.Add(1)
		go n.regionLoop()
	}
	go n.leaseLoop()
	go n.heartbeatLoop()
	go n.pauseQueryLoop()
	go n.rebuildLoop()
	go n.rateLoop()
	go n.replicateLoop()
	go n.handoffLoop()
	go n.reconnectLoop()
	go n.sweepLoop()
	if len(n.cfg.Join) == 0 {
		n.enterRing()
		return nil
	}
	if n.tryJoin() {
		return n.refusal()
	}
	n.wg.Add(1)
	go n.joinLoop()
	return nil
}

// Leave tells the gossip pool this node is leaving, waiting up to
// LeaveTimeout (or ctx) for the message to reach a member; a message no
// member took up in time is logged, not returned (the members are
// stopping too, or will see the node fail). Before leaving the pool it
// hands every counter to its next owner, within HandoffTimeout (or ctx);
// when some were not handed off it logs how many and returns an error
// saying so (they remain in the store and on their replicas). The node
// keeps answering forwarded checks until Shutdown. It is safe to call more
// than once; later calls return nil, once the first has returned.
//
// Phases: joining or ready → leaving → draining → left; starting → left.
func (n *Node) Leave(ctx context.Context) error {
	// leaveMu orders the gossiped flags: enterRing publishes ready under
	// it, so a leave never has its leaving flag overwritten.
	n.leaveMu.Lock()
	defer n.leaveMu.Unlock()
	if _, ok := n.life.to(ownership.Leaving); !ok {
		n.life.to(ownership.Left) // from starting: nothing to announce
		return nil
	}
	ml := n.ml.Load()
	if ml == nil {
		return nil // Start is creating the memberlist: nothing to announce yet
	}
	timeout := n.cfg.LeaveTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	// First tell the others this is a graceful leave: they drop this node
	// from their rings and pull its keys on first touch (each pull releases
	// the key here), while this node still decides the keys nobody pulled.
	// Once the news has spread, stop deciding, route around this node, hand
	// every remaining counter to its next owner, then leave.
	n.deleg.setMeta(n.meta())
	if err := ml.UpdateNode(timeout / 2); err != nil {
		n.log.Warn("leaving flag not gossiped", "err", err)
	}
	t := time.NewTimer(n.cfg.LeavePropagation)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	before := n.ring.Table()
	n.life.to(ownership.Draining)
	n.rebuild()
	hctx, cancel := context.WithTimeout(ctx, n.cfg.HandoffTimeout)
	derr := n.drain(hctx, before)
	cancel()
	// memberlist's only error here is that the leave message did not go
	// out in time, which happens when the other members are stopping too
	// (a whole cluster's SIGTERM). The counters are handed off (or derr
	// says which were not) and flushed by now, and members that missed
	// the message see this node fail instead, so the stop is still
	// graceful.
	if err := ml.Leave(timeout); err != nil {
		n.log.Warn("leave message not confirmed; members still running will detect the node as failed instead",
			"timeout", timeout, "err", err)
	}
	n.life.to(ownership.Left)
	return derr
}

// Shutdown leaves the gossip pool (if Leave was not called), stops the
// memberlist and every goroutine the node started, flushes the cache and
// closes the store. It returns every error, among them Leave's when it
// leaves here (an incomplete handoff); later calls return them too.
func (n *Node) Shutdown(ctx context.Context) error {
	n.shutOnce.Do(func() {
		errs := []error{n.Leave(ctx)}
		if ml := n.ml.Load(); ml != nil {
			errs = append(errs, ml.Shutdown())
		}
		close(n.stop)
		n.wg.Wait()
		if len(n.ovr.save) > 0 {
			n.saveOverrides() // a change the saver had no time for
		}
		n.pause.mu.Lock()
		if n.pause.evidence != nil {
			n.pause.evidence.close()
			n.pause.evidence = nil
		}
		n.pause.mu.Unlock()
		errs = append(errs, n.cache.Close(ctx))
		n.shutErr = errors.Join(errs...)
	})
	return n.shutErr
}

// refusedAll answers every item with the refusal when this node gave up
// joining (its name is taken): it is no member, neither deciding nor
// forwarding, so its clients learn it at once.
func (n *Node) refusedAll(out []check.Outcome) bool {
	err := n.refusal()
	if err == nil {
		return false
	}
	for i := range out {
		out[i] = check.Outcome{Owner: n.name, Err: err.Error()}
	}
	return true
}
