package cluster

import (
	"time"

	"github.com/sluicehq/sluice/ring"
)

// A node that stops running for a while — SIGSTOP, a long GC pause, a VM
// freeze, a starved process — is a gray failure: to its peers it is alive
// to TCP but answers nothing. Their forwards time out after ForwardTimeout
// and the key's replica decides them as a stand-in; once the failure
// detector declares the node dead, the next owner on the ring decides its
// keys. Neither can tell the frozen node, and the node itself noticed
// nothing: when it runs again its ring is the one it had, and its counts are
// those of before the pause. Deciding from them would forget everything the
// others admitted meanwhile.
//
// So the node watches its own clock. A heartbeat stamps the time every
// ForwardTimeout/4, and every decision first compares its now with the last
// stamp: a gap of more than ForwardTimeout (the earliest a peer can have
// given up on this node) means the node was not running, and before it
// decides anything it registers a move (see move) from the ring without
// itself to its current ring, limited to the keys it owns. The keys it owns
// are then pulled on first touch, as after a restart, from the node that
// owned them while this one was declared dead (releasing them there) and
// from their replicas (which stood in for it before that), and the newest
// version wins. Versions are max(previous + 1, now), so a copy that started
// from this node's last replicated record and was changed outranks it.
//
// Order is what makes it safe: the move is registered before the heartbeat
// moves on, and a decision reads the heartbeat before the moves, so no
// decision that runs after the pause (with a now taken after it) can miss
// the move. A decision that was already running when the process froze
// finishes with its old now and may change the stale state; the pull that
// follows replaces that state with the newer copy, so its hit is counted
// where the stand-in counted it too (its sender timed out and failed over)
// or, when nobody stood in, it was admitted just before the pause and is
// among the hits admitted since the last replication — the same bound as
// for a crash. Forwards that waited in the node's sockets through the pause
// arrive with their sender's cancellation right behind them: a check whose
// context is done is not decided (decideGated), and a settle cut short marks
// nothing settled, so they cannot decide from the stale state either.
//
// A step of the wall clock forward by more than ForwardTimeout looks like
// a pause and costs one pull per owned key touched: it is safe.
//
// The node tells an overloaded machine (starved), a long collection
// (busy) and a stopped process apart where the system shows it
// (starve.go), for the log and the status; it reacts to each the same.

// pauseCheck notices a pause (the event "pause noticed") before a decision
// taken at now (Unix ns).
func (n *Node) pauseCheck(now int64) {
	if now-n.beat.last.Load() > int64(n.cfg.ForwardTimeout) {
		n.noticePause(now)
	}
}

// heartbeatLoop stamps the time every ForwardTimeout/4 and notices pauses
// that no decision noticed first. After HeartbeatIdle without a check or a
// peer's check call it stops (beatLoop); the next decision finds the gap,
// handles it as a pause and wakes it.
func (n *Node) heartbeatLoop() {
	defer n.wg.Done()
	beats := 0
	beatLoop(n.stop, n.beat.wake, max(n.cfg.ForwardTimeout/4, time.Millisecond), n.cfg.HeartbeatIdle,
		func() uint64 { return n.stats.checks.Load() + n.stats.answered.Load() },
		func(time.Time) {
			now := n.now().UnixNano()
			n.pauseCheck(now)
			// The CPU evidence a gap is explained by, every fourth beat
			// (reading it costs tens of microseconds).
			if beats++; beats%4 == 0 {
				n.pause.mu.Lock()
				n.sampleCPU()
				n.pause.mu.Unlock()
			}
			n.beat.last.Store(max(n.beat.last.Load(), now))
		},
		func(idle bool) {
			n.beat.idle.Store(idle)
			if idle {
				n.log.Debug("idle: the pause heartbeat stops until the next check", "after", n.cfg.HeartbeatIdle)
			}
		})
}

// noticePause handles a gap in the heartbeat seen at now: once per gap,
// whoever sees it first, and before the heartbeat moves on.
func (n *Node) noticePause(now int64) {
	n.pause.mu.Lock()
	defer n.pause.mu.Unlock()
	last := n.beat.last.Load()
	if now-last <= int64(n.cfg.ForwardTimeout) {
		return // handled by another caller
	}
	n.pausedFor(time.Duration(now-last), now, n.beat.idle.Load())
	n.sampleCPU()
	n.beat.last.Store(now)
	select { // wake the heartbeat if it stopped
	case n.beat.wake <- struct{}{}:
	default:
	}
}

// sampleCPU records, at a beat, what a later gap is explained by
// (starve.go). n.pause.mu is held.
func (n *Node) sampleCPU() {
	if n.pause.evidence != nil {
		n.pause.lastCPU = n.pause.evidence.sample()
	}
}

// pauseLogEvery is the least time between two log lines about pauses: an
// overloaded machine can starve a node several times a second, and each
// line would be more work for it. The lines say how many pauses they
// stand for.
const pauseLogEvery = 10 * time.Second

// pausedFor registers, after a pause of d, that every key this node owns
// may be held newer elsewhere: a move from the ring without this node (who
// took its keys when it was declared dead) to the current ring (whose
// replicas stood in for it before that), for the keys it owns in the
// current ring only. idle: the heartbeat had stopped for want of checks
// (HeartbeatIdle), so the gap is most likely idleness; it is handled the
// same way, but counted and logged apart from pauses. n.pause.mu is held.
//
// The reaction is bounded whatever the rate of pauses: one move for all
// the keys (a newer pause move replaces an older one over the same table,
// ownership.Book.Paused), the ring without this node built once per table,
// and a key pulled at most once per pause, when it is next checked; an
// idle node pulls nothing.
func (n *Node) pausedFor(d time.Duration, now int64, idle bool) {
	if !n.life.inRing() || n.draining() {
		return
	}
	cur := n.ring.Table()
	prev := n.pause.prev
	if prev == nil || n.pause.cur != cur {
		var others []ring.Member
		for _, m := range cur.Members() {
			if m.Name != n.name {
				others = append(others, m)
			}
		}
		if len(others) == 0 || len(others) == cur.Len() {
			return // alone, or not in its own ring: nobody decided for it
		}
		var err error
		if prev, err = n.ring.Build(others); err != nil {
			n.log.Error("paused: ring without this node not built; keys not pulled", "err", err)
			return
		}
		n.pause.prev, n.pause.cur = prev, cur
	}
	n.askAfterPause(n.book.Paused(prev, cur, now, now-int64(d)), time.Now())
	if idle {
		n.stats.idleResumes.Add(1)
		n.log.Info("first decision after an idle spell (the pause heartbeat had stopped): "+
			"each key this node owns is pulled from its peers before its next decision, in case this node was in fact paused",
			"gap", d.Round(time.Millisecond), "window", n.cfg.MoveWindow)
		return
	}
	n.stats.pauses.Add(1)
	cause := PauseStopped
	if n.pause.evidence != nil {
		cause = pauseCause(n.pause.lastCPU, n.pause.evidence.sample(), d)
	}
	switch cause {
	case PauseStarved:
		n.stats.pausesStarved.Add(1)
	case PauseBusy:
		n.stats.pausesBusy.Add(1)
	}
	n.pause.unlogged++
	if now-n.pause.loggedAt < int64(pauseLogEvery) && n.pause.loggedAt != 0 {
		return
	}
	n.log.Warn("this node did not run for longer than the forward timeout: "+
		"its peers may have decided its keys meanwhile, so each key it owns is pulled from them before its next decision",
		"gap", d.Round(time.Millisecond), "cause", cause, "forward_timeout", n.cfg.ForwardTimeout, "window", n.cfg.MoveWindow,
		"pauses_since_last_line", n.pause.unlogged)
	n.pause.loggedAt, n.pause.unlogged = now, 0
}
