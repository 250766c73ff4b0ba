package cluster

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func memberState(n *Node, name string) string {
	for _, m := range n.Status().Members {
		if m.Name == name {
			return m.State
		}
	}
	return ""
}

// TestStatusShowsSuspect cuts one member of three off the gossip network:
// the others' failure detectors suspect it (status says suspect) before
// they declare it dead. Then a member that answers again is alive.
func TestStatusShowsSuspect(t *testing.T) {
	t.Parallel()
	nodes, filters := startFiltered(t, NewMemNetwork(), "s", 3, func(cfg *Config) {
		// Long enough a suspicion to be seen by polling every 10 ms.
		cfg.SuspicionMult = 6
	})
	WaitRings(t, nodes)
	a, c := nodes[0], nodes[2]
	if s := memberState(a, c.Name()); s != StateAlive {
		t.Fatalf("before the cut %s is %q", c.Name(), s)
	}

	// Cut c off: nobody reaches it, directly or through another member.
	for i := range 2 {
		filters[i].Block(c.GossipAddr())
		filters[2].Block(nodes[i].GossipAddr())
	}
	seen := map[string]bool{}
	inRing := false // a ring rebuilt while c is suspect still holds it
	WaitFor(t, 30*time.Second, c.Name()+" is dead on "+a.Name(), func() bool {
		s := memberState(a, c.Name())
		seen[s] = true
		if s == StateSuspect && !inRing {
			a.rebuild()
			_, has := a.Ring().Table().Shares()[c.Name()]
			if memberState(a, c.Name()) == StateSuspect { // not dead meanwhile
				if !has {
					t.Fatalf("the ring rebuilt while %s is suspect left it out", c.Name())
				}
				inRing = true
			}
		}
		return s == StateDead
	})
	if !seen[StateSuspect] || !inRing {
		t.Fatalf("%s went dead on %s without being suspect first (ring checked: %v); states seen %v", c.Name(), a.Name(), inRing, seen)
	}
	if _, has := a.Ring().Table().Shares()[c.Name()]; has {
		WaitFor(t, 10*time.Second, "the dead member leaves the ring", func() bool {
			_, has := a.Ring().Table().Shares()[c.Name()]
			return !has
		})
	}
}

// TestSuspectClearedByAnswer: a suspect member whose probe is answered is
// alive again.
func TestSuspectClearedByAnswer(t *testing.T) {
	t.Parallel()
	r := &roster{}
	n := &memberlist.Node{Name: "x", Meta: encodeMeta(meta{grpcAddr: "x:1"})}
	r.joined(n)
	d := &delegate{roster: r, changed: make(chan struct{}, 1)}
	w := slogWriter{next: io.Discard, onSuspect: r.suspected}
	fmt.Fprintf(w, "[INFO] memberlist: Suspect %s has failed, no acks received\n", "x")
	if s := r.all()[0].state; s != StateSuspect {
		t.Fatalf("after the log line: %q", s)
	}
	d.NotifyPingComplete(n, time.Millisecond, nil)
	if s := r.all()[0].state; s != StateAlive {
		t.Fatalf("after an answered probe: %q", s)
	}
	// An alive message about it (its refutation of the suspicion) clears
	// it too: at 100 members this node's next probe of it may be 100 s
	// away, and 10 of 100 nodes of a deploy run still showed a member
	// suspect 3 minutes after the cluster formed.
	fmt.Fprintf(w, "[INFO] memberlist: Suspect %s has failed, no acks received\n", "x")
	if s := r.all()[0].state; s != StateSuspect {
		t.Fatalf("after the second log line: %q", s)
	}
	if err := d.NotifyAlive(n); err != nil {
		t.Fatalf("NotifyAlive refused: %v", err)
	}
	if s := r.all()[0].state; s != StateAlive {
		t.Fatalf("after an alive message: %q", s)
	}
	// A dead member stays dead whatever is logged or answered.
	r.departed(n)
	fmt.Fprintf(w, "[INFO] memberlist: Suspect %s has failed, no acks received\n", "x")
	d.NotifyPingComplete(n, time.Millisecond, nil)
	d.NotifyAlive(n) // memberlist's NotifyJoin, not this, brings a dead member back
	if s := r.all()[0].state; s != StateDead {
		t.Fatalf("dead member became %q", s)
	}
}
