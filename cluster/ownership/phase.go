package ownership

import "fmt"

// Phase is where a node is in its lifecycle, the one enum of it: the node
// (package cluster) holds its phase and moves it only along Legal
// transitions, and Step reads it from the facts.
//
//	Starting ──Start──▶ Joining ──joined──▶ Ready ──Leave──▶ Leaving ──drain──▶ Draining ──left──▶ Left
//	   │                 │   │                                  ▲
//	   │                 │   └────────────Leave─────────────────┘
//	   │                 └──name taken──▶ Refused
//	   └──Leave (never started)──▶ Left
//
// Whether the node is in the ring (it takes partitions: Facts.InRing) is
// not a phase: a node without seeds is in its own ring before it starts,
// and a node that leaves while joining never was. The node holds it with
// the phase in one word, set by the move to Ready.
type Phase uint8

const (
	// Starting: built; not started yet.
	Starting Phase = iota
	// Joining: started; it gossips and looks for a seed that answers. It
	// decides nothing it owns (the joining error) unless it has no seeds.
	Joining
	// Ready: joined (or alone), the ready flag gossiped: it takes its
	// partitions and decides the keys it owns.
	Ready
	// Leaving: its leave began: the leaving flag is gossiped, the others
	// route around it and pull its keys on first touch; it still decides
	// the keys nobody has pulled, and never takes back a key pulled from it.
	Leaving
	// Draining: the announcement is over: it decides nothing it does not
	// own in its table, pulls nothing, releases nothing when pulled,
	// refuses handoffs, and hands every counter on.
	Draining
	// Left: drained and out of the gossip pool (or it left before it
	// started). It still answers forwarded checks with moved_to until it
	// shuts down.
	Left
	// Refused: another live member has its name: it gave up joining for
	// good and answers every check with the refusal.
	Refused
	numPhases
)

var phaseNames = [numPhases]string{"starting", "joining", "ready", "leaving", "draining", "left", "refused"}

func (p Phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// transitions lists every legal transition: transitions[from] has bit to
// set when from → to is allowed. Nothing leaves Left or Refused.
var transitions = [numPhases]uint32{
	Starting: 1<<Joining | 1<<Left,
	Joining:  1<<Ready | 1<<Leaving | 1<<Refused,
	Ready:    1 << Leaving,
	Leaving:  1 << Draining,
	Draining: 1 << Left,
}

// Legal reports whether from → to is a transition of the lifecycle.
func Legal(from, to Phase) bool {
	return from < numPhases && to < numPhases && transitions[from]&(1<<to) != 0
}

// Leaves reports whether a node in phase p has begun to leave and still
// decides (Leaving, or Refused, which announces its leave too): it decides
// the keys it owns in its own view, but never takes back a key another
// node pulled from it.
func (p Phase) Leaves() bool { return p == Leaving || p == Refused }

// Drains reports whether a node in phase p decides nothing it does not own
// in its table, pulls nothing, releases nothing when pulled and refuses
// handoffs (Draining, Left).
func (p Phase) Drains() bool { return p == Draining || p == Left }
