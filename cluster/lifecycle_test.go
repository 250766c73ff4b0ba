package cluster

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/cluster/ownership"
)

// The lifecycle's transitions, written out pair by pair (docs/ownership.md,
// "The node's lifecycle"): every other pair must be refused.
var wantTransitions = map[[2]ownership.Phase]bool{
	{ownership.Starting, ownership.Joining}: true, // Start
	{ownership.Starting, ownership.Left}:    true, // Leave before Start
	{ownership.Joining, ownership.Ready}:    true, // joined (or alone): enterRing
	{ownership.Joining, ownership.Leaving}:  true, // Leave while joining
	{ownership.Joining, ownership.Refused}:  true, // name taken: refuseName
	{ownership.Ready, ownership.Leaving}:    true, // Leave
	{ownership.Leaving, ownership.Draining}: true, // the leave announcement is over
	{ownership.Draining, ownership.Left}:    true, // drained, out of the gossip pool
}

// phases is the number of phases: ownership.Refused is the last.
const phases = ownership.Refused + 1

func TestLifecycleTransitionTable(t *testing.T) {
	t.Parallel()
	for from := range phases {
		for to := range phases {
			want := wantTransitions[[2]ownership.Phase{from, to}]
			var l lifecycle
			l.p.Store(uint32(from))
			was, ok := l.to(to)
			if was != from || ok != want {
				t.Errorf("to(%s) from %s = (%s, %v), want (%s, %v)", to, from, was, ok, from, want)
			}
			if now := l.load(); (want && now != to) || (!want && now != from) {
				t.Errorf("after to(%s) from %s the phase is %s", to, from, now)
			}
		}
	}
	for p := range phases {
		if s := p.String(); s == "" || strings.HasPrefix(s, "phase(") {
			t.Errorf("phase %d has no name", p)
		}
	}
}

// TestLifecycleRaceOneWinner: of many goroutines moving ready → leaving at
// once, exactly one moves it; the others see leaving and are refused.
func TestLifecycleRaceOneWinner(t *testing.T) {
	t.Parallel()
	var l lifecycle
	for _, p := range []ownership.Phase{ownership.Joining, ownership.Ready} {
		if _, ok := l.to(p); !ok {
			t.Fatalf("cannot move to %s", p)
		}
	}
	var wins atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if from, ok := l.to(ownership.Leaving); ok {
				wins.Add(1)
			} else if from != ownership.Leaving {
				t.Errorf("refused from %s, want from leaving", from)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 || l.load() != ownership.Leaving {
		t.Fatalf("%d goroutines moved the phase; it is %s", wins.Load(), l.load())
	}
}

// TestNodeLifecycle drives a real node through its phases: a seedless node
// is starting (and already in its own ring) until Start, ready after it,
// left after Leave, and can neither start nor leave again.
func TestNodeLifecycle(t *testing.T) {
	t.Parallel()
	n, err := New(NodeConfig(t, "n0", memAddr(0)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	if p := n.life.load(); p != ownership.Starting || n.Ready() || !n.life.inRing() {
		t.Fatalf("after New: phase %s, ready %v, in ring %v; want starting, false, true", p, n.Ready(), n.life.inRing())
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := n.life.load(); p != ownership.Ready || !n.Ready() || n.leaving() || n.draining() {
		t.Fatalf("after Start: phase %s, ready %v, leaving %v, draining %v", p, n.Ready(), n.leaving(), n.draining())
	}
	if err := n.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "ready") {
		t.Fatalf("second Start = %v, want an error naming the phase", err)
	}
	if err := n.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := n.life.load(); p != ownership.Left || n.Ready() || !n.leaving() || !n.draining() {
		t.Fatalf("after Leave: phase %s, ready %v, leaving %v, draining %v", p, n.Ready(), n.leaving(), n.draining())
	}
	if err := n.Leave(context.Background()); err != nil || n.life.load() != ownership.Left {
		t.Fatalf("second Leave = %v, phase %s", err, n.life.load())
	}
}

// TestLeaveBeforeStart: a node left before it started announces nothing,
// is left, and refuses to start.
func TestLeaveBeforeStart(t *testing.T) {
	t.Parallel()
	n, err := New(NodeConfig(t, "n0", memAddr(0)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if p := n.life.load(); p != ownership.Left {
		t.Fatalf("phase %s after Shutdown before Start, want left", p)
	}
	if err := n.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "left") {
		t.Fatalf("Start after Shutdown = %v, want an error saying the node left", err)
	}
}

// TestLifecycleRingFollowsThePhase: the ring bit is set by becoming Ready
// (or by alone, before Start) and never by another transition, and it
// stays set through the leave; a node that leaves or is refused while
// joining never enters the ring.
func TestLifecycleRingFollowsThePhase(t *testing.T) {
	t.Parallel()
	step := func(l *lifecycle, to ownership.Phase) {
		t.Helper()
		if from, ok := l.to(to); !ok {
			t.Fatalf("%s -> %s refused", from, to)
		}
	}
	check := func(l *lifecycle, want ownership.Phase, in bool) {
		t.Helper()
		if p, r := l.state(); p != want || r != in || l.load() != want || l.inRing() != in {
			t.Fatalf("state %s, in ring %v; want %s, %v", p, r, want, in)
		}
	}
	var seeded lifecycle
	check(&seeded, ownership.Starting, false)
	step(&seeded, ownership.Joining)
	check(&seeded, ownership.Joining, false)
	step(&seeded, ownership.Ready)
	check(&seeded, ownership.Ready, true)
	for _, p := range []ownership.Phase{ownership.Leaving, ownership.Draining, ownership.Left} {
		step(&seeded, p)
		check(&seeded, p, true)
	}

	var alone lifecycle
	alone.alone()
	check(&alone, ownership.Starting, true)
	step(&alone, ownership.Joining)
	check(&alone, ownership.Joining, true)

	for _, end := range []ownership.Phase{ownership.Leaving, ownership.Refused} {
		var l lifecycle
		step(&l, ownership.Joining)
		step(&l, end)
		check(&l, end, false)
		if _, ok := l.to(ownership.Ready); ok {
			t.Fatalf("%s -> ready allowed", end)
		}
		check(&l, end, false)
	}
}
