package ownership

// Step: docs/ownership.md's transitions as one pure function. The node
// reads a key's facts off its records at the moment of an event, calls
// Step, and carries out the effects in the order their fields are listed.

// State is a key's state on a node, as docs/ownership.md names it.
type State uint8

const (
	Unowned State = iota
	Replica
	Owned
	Unsettled
	Pulling
	ReleasedTo
	StandingIn
)

var stateNames = [...]string{"unowned", "replica", "owned", "unsettled", "pulling", "released to", "standing in"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "state(?)"
}

// Facts are what a node knows about one key at the moment of an event,
// read off its table, its Book and its cache.
type Facts struct {
	Phase    Phase
	SelfAddr string
	// InRing: the node takes partitions in its own ring (it has joined,
	// or has no seeds). A node not in the ring yet does not decide the
	// keys it owns in its table for its clients.
	InRing bool
	// Owns: the node's table names it the key's owner (or names nobody).
	Owns bool
	// OwnerAddr is the owner's address in the node's table when it is
	// another node.
	OwnerAddr string
	// Replica: the node is among the key's replicas in its table.
	Replica bool
	// Unsettled: a move in its window applies to the key and has not
	// settled it (Moves.Unsettled).
	Unsettled bool
	// Released: the cache holds a release of the key (its decisions
	// answer ErrMoved); ReleasedTo is where it went, when recorded.
	Released   bool
	ReleasedTo string
	// ReleasedToUnseen: ReleasedTo is no member of this node's table, and
	// not because it is leaving, left or died: a node whose join this one
	// has yet to see through took the key. Its table is newer than this
	// node's, and names it the owner.
	ReleasedToUnseen bool
	// HandedBy is the address of the node that handed the key here by a
	// handoff (a push), when this node has not released the key since and
	// the move window has not ended (Book.HandedBy). Its table named this
	// node the owner, so when this node's own table still names that node
	// (this node has not seen the change yet), this node decides the key:
	// the node that handed it points checks here, and would otherwise
	// point them back and forth with this node.
	HandedBy string
}

// Decides reports whether the key's checks are decided here rather than
// forwarded: this node owns the key in its table (or its table names
// nobody), or the owner its table names handed the key here (HandedBy).
func (f Facts) Decides() bool {
	return f.Owns || (f.HandedBy != "" && f.HandedBy == f.OwnerAddr)
}

// State returns the key's state the facts describe.
func (f Facts) State() State {
	switch {
	case f.Released:
		return ReleasedTo
	case f.Owns && f.Unsettled:
		return Unsettled
	case f.Decides():
		return Owned
	case f.Replica:
		return Replica
	}
	return Unowned
}

// Kind is the kind of an event about one key.
type Kind uint8

const (
	// Check: a client's check arrived here (Node.Check).
	Check Kind = iota
	// Forwarded: another node sent the check here as the key's owner.
	Forwarded
	// StandIn: another node sent the check here because the owner did
	// not answer; From is the node to pull the key from first (pull_from).
	StandIn
	// Failover: this node is the key's first replica and the owner did
	// not answer a forward: it decides from its copy, but a key it had
	// released and does not own goes to the owner-unavailable policy.
	Failover
	// Serve: the owner-unavailable policy serve: decide from whatever
	// this node holds, taking back a key it had released.
	Serve
	// Pull: a peer's pull of the key; From is the puller's address,
	// Release whether the key is released to it.
	Pull
	// Push: a handoff; the sender hands the key to this node.
	Push
	// Replicate: the owner's copy of the key.
	Replicate
	// Lost: a table change moved the key's partition to OwnerAddr
	// (handoff).
	Lost
)

// Event is one event about one key.
type Event struct {
	Kind    Kind
	From    string
	Release bool
	// After is what became of the effects of the event's previous step,
	// when the node steps again for the same event (Carried the first
	// time); Crossings counts its Crossed results so far.
	After     Result
	Crossings int
}

// Result is what became of a step's effects when the node could not carry
// them all out: it steps again for the same event with Event.After set,
// its facts read afresh, and Step says what to do then (take the key back
// from where it went, point there, or give the check up).
type Result uint8

const (
	// Carried: the event's first step.
	Carried Result = iota
	// Fenced: the cache refused the decision, or a handoff's fence,
	// because the key had been released meanwhile (the facts then hold
	// the release: Facts.Released, ReleasedTo).
	Fenced
	// Crossed: a Reclaim failed because a pull released the key here
	// again while this node took it back: the node it pulled the key back
	// from pulled it from here in the same moment (each took the other
	// for the node it had released the key to) and decides it. Lifting
	// the release would have both decide from the same count.
	Crossed
	// NotSettled: a Settle left the key unsettled: a member that may
	// hold a newer copy did not answer its pull.
	NotSettled
	// Cancelled: the check's caller stopped waiting (its context ended)
	// before the decision.
	Cancelled
)

var resultNames = [...]string{"carried", "fenced", "crossed", "not settled", "cancelled"}

func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "result(?)"
}

// MaxCrossings is how many times in a row a check takes a key back again
// after another node's pull crossed its own (Crossed) before it gives the
// check up: two nodes that keep pulling one key from each other would
// otherwise hold the check until its deadline.
const MaxCrossings = 2

// Effects is what the node does for one event, in field order. A check's
// effects end with a decision from the cache (Decide), a redirect
// (Redirect), a forward (Forward), the joining error (Joining), or giving
// the check up (Abandon).
type Effects struct {
	// Next is the key's state once the effects are carried out: the
	// table's "to" column in docs/ownership.md, which the tests check.
	// The node carries out effects and reads its records, so it has no
	// use for it. (For effects the node cannot all carry out, Step is
	// called again with Event.After.)
	Next State
	// Joining: answer the check that this node is joining, deciding
	// nothing: what it holds may be stale, and the cluster has not handed
	// it anything yet.
	Joining bool
	// Abandon: answer the check abandoned (Event.After says why),
	// deciding nothing: its sender, or this node when the check came here
	// first, fails it over to the key's replica. NoteGivenUp: and note
	// that this node, the key's owner, gave up a check of it, so that it
	// pulls the replica's stand-in decision before it decides the key
	// again (PullStandIn).
	Abandon, NoteGivenUp bool
	// Redirect: answer the check moved_to this address, deciding nothing.
	Redirect string
	// Forward: send the check to the owner (OwnerAddr).
	Forward bool
	// PullFrom: pull the key from this address, releasing it there, and
	// adopt what is newer.
	PullFrom string
	// Settle: pull the key from the holders Moves.Plan names first.
	Settle bool
	// Reclaim: end the cache's release of the key, unless a pull released
	// it again since the step (then step again, Crossed).
	Reclaim bool
	// PullStandIn: before deciding, when this node gave up a check of
	// the key since it last decided it (NoteGivenUp), pull the key's
	// replica's copy without releasing it there and install it: the
	// replica may have decided that check as a stand-in.
	PullStandIn bool
	// Decide: decide the check from the cache.
	Decide bool
	// Release: release the key (atomically with reading its record) to
	// NoteTo and record that in the Book.
	Release bool
	NoteTo  string
	// MovedTo: a pull's answer says the key had already been released to
	// this other node.
	MovedTo string
	// Holders: a pull's answer names the nodes this node would pull the
	// key from before deciding it (Moves.Plan): it never settled the key
	// since a move gave it here, so its own record may miss what they hold.
	Holders bool
	// Push: push the released record to NoteTo (handoff).
	Push bool
	// HandedFrom: the key was pushed here by the node at this address;
	// the book records it for the key's facts (Facts.HandedBy).
	HandedFrom string
	// SendCopy: send the record to OwnerAddr as a copy (a replicate, not
	// a handoff): the new owner installs it when newer and still pulls the
	// key on first touch, but no longer needs this node alive for it.
	SendCopy bool
	// Adopt: install the record, ending a release when it is newer than
	// what is held (a stale copy changes nothing); MarkSettled: once it
	// installed, no move pulls it any more.
	Adopt, MarkSettled bool
	// HeldSettles: with Adopt, a record the node already holds exactly
	// (the copy its sender replicated here before) settles the key as an
	// install would, and ends a release of the key to the sender. The
	// sender decided the key last: it is not released here, or it was
	// released to the sender, who hands it back.
	HeldSettles bool
	// Merge: install the copy as a replica's (newer version, or the merge).
	Merge bool
	// Stale: refuse the record (counted stale).
	Stale bool
}

// DecidesAsItStands reports whether the effects decide the check here with
// nothing to carry out first: no joining answer, forward, redirect, pull,
// settle or reclaim. A lease return is refunded only then: a key that is
// not decided here as it stands has its count elsewhere, or a count this
// node has yet to take in.
func (e Effects) DecidesAsItStands() bool {
	return e.Decide && !e.Joining && !e.Forward && e.Redirect == "" && e.PullFrom == "" && !e.Settle && !e.Reclaim
}

// Step returns the effects of event e on a key with facts f. It has no
// side effects. An event whose effects the node could not all carry out
// is stepped again with Event.After (Result).
func Step(f Facts, e Event) Effects {
	if e.After == Fenced || e.After == Crossed {
		f.Released = true
	}
	switch e.Kind {
	case Check, Forwarded, StandIn, Failover:
		if e.After != Carried {
			if eff, ok := giveUp(f, e); ok {
				return eff
			}
		}
		if e.Kind == Check && f.Owns && !f.InRing {
			return Effects{Next: f.State(), Joining: true}
		}
		if f.Released {
			return checkReleased(f, e)
		}
		return check(f, e)
	case Serve:
		return Effects{Next: StandingIn, Reclaim: f.Released, Decide: true}
	case Pull:
		if !e.Release || f.Phase.Drains() {
			return Effects{Next: f.State(), Holders: f.Unsettled}
		}
		eff := Effects{Next: ReleasedTo, Release: true, NoteTo: e.From, Holders: f.Unsettled}
		if f.Released && f.ReleasedTo != "" && f.ReleasedTo != e.From {
			eff.MovedTo = f.ReleasedTo
		}
		return eff
	case Push:
		if f.Phase.Drains() {
			return Effects{Next: f.State(), Stale: true}
		}
		return Effects{Next: Owned, Adopt: true, MarkSettled: true, HandedFrom: e.From,
			HeldSettles: !f.Released || (f.ReleasedTo != "" && f.ReleasedTo == e.From)}
	case Replicate:
		if f.Owns && !f.Unsettled && !f.Phase.Drains() {
			return Effects{Next: f.State(), Stale: true}
		}
		// An owner that has not settled the key since a move gave it here
		// takes the copy as it would a pull's answer: the newer version, or
		// the merge. Its pull on first touch still runs.
		return Effects{Next: f.State(), Merge: true}
	case Lost:
		if f.Released {
			// Released to another node before the change: that node took
			// this node's state and decides the key; a push of this
			// node's record would be stale, and its receiver would take
			// it as settled and never pull. The new owner pulls this node
			// on first touch, and the answer names where the key went.
			return Effects{Next: ReleasedTo}
		}
		if f.Unsettled {
			// An earlier change gave this node the key and it never
			// touched it since, so never pulled it: what it holds may be
			// stale. A handoff would make the new owner take it as settled
			// and skip its pulls (among them the key's replicas, which
			// hold the newer count); the new owner pulls it on first touch.
			// But it gets the copy now, as a replica's: should this node
			// crash before that touch, the copy it held, perhaps the only
			// one (model seed 99184), is not lost with it.
			return Effects{Next: Unowned, SendCopy: true}
		}
		return Effects{Next: ReleasedTo, Release: true, NoteTo: f.OwnerAddr, Push: true}
	}
	return Effects{Next: f.State()}
}

// giveUp returns the effects of a check the node must give up, given
// what became of its previous step (Event.After), and whether it must.
func giveUp(f Facts, e Event) (Effects, bool) {
	switch {
	case e.After == Cancelled:
		// Nobody waits for the answer, and what this node holds may be
		// stale (a forward that reached it after a pause, with its
		// sender's cancellation right behind it; a settle cut short): a
		// decision from it would only risk outranking a newer count. The
		// sender of a forward fails it over to the key's replica.
		return Effects{Next: f.State(), Abandon: true, NoteGivenUp: f.Owns && e.Kind == Forwarded}, true
	case e.After == NotSettled:
		// Deciding from an older copy would outrank the holder's newer
		// count; the replica, which holds the count, decides instead.
		return Effects{Next: f.State(), Abandon: true}, true
	case e.After == Crossed && e.Crossings > MaxCrossings:
		return Effects{Next: f.State(), Abandon: true, NoteGivenUp: f.Owns && owning(e)}, true
	}
	return Effects{}, false
}

// check is a check of a key the cache has not refused (yet).
func check(f Facts, e Event) Effects {
	switch {
	case e.Kind == Check && !f.Decides():
		return Effects{Next: f.State(), Forward: true}
	case f.Phase.Drains() && !f.Owns:
		// A draining node decides nothing it does not own, not even a
		// key handed here: it hands on what it holds.
		return Effects{Next: f.State(), Redirect: f.OwnerAddr}
	case e.Kind == Forwarded && !f.Decides():
		// Never forwarded again: the sender asks the owner this node sees.
		return Effects{Next: f.State(), Redirect: f.OwnerAddr}
	}
	// An owner's own checks, and checks sent to it as the owner, take in
	// what a stand-in decided for it first (PullStandIn).
	eff := Effects{Next: Owned, Settle: f.Unsettled, Decide: true, PullStandIn: f.Owns && owning(e)}
	if e.Kind == Failover {
		eff.Next = StandingIn
	}
	if e.Kind == StandIn {
		eff.Next = StandingIn
		if e.From != "" && e.From != f.SelfAddr {
			eff.PullFrom = e.From
		}
	}
	return eff
}

// checkReleased is a check whose decision the cache refused: this node
// had released the key (released to X).
func checkReleased(f Facts, e Event) Effects {
	if f.Phase.Leaves() || ((!f.Owns || f.ReleasedToUnseen) && e.Kind != StandIn) {
		// A leaving node still owns every key in its own view, but it
		// never takes back a key another node pulled from it: taking it
		// back would let the puller, which owns the key in every other
		// view, decide from the same count. It points there, or, when it
		// knows nowhere to point, decides. So does a node whose table
		// has yet to show the node it released the key to (a joiner that
		// took its keys): that node's table is the newer one, and taking
		// the key back would have the two pull it from each other on every
		// check until this node's table catches up.
		to := f.ReleasedTo
		if to == f.SelfAddr {
			to = "" // never pointed at itself
		}
		if to == "" && !f.Owns {
			to = f.OwnerAddr
		}
		if to != "" {
			return Effects{Next: ReleasedTo, Redirect: to}
		}
		return Effects{Next: Owned, Reclaim: true, Decide: true, PullStandIn: f.Owns && owning(e)}
	}
	if !f.Owns {
		// A stand-in: a redirect would leave the sender to its own policy,
		// deciding from what it holds (nothing, for a key it does not
		// replicate), so the stand-in takes the key back and decides —
		// after pulling it from where it went: X took this node's state
		// and may have decided since, so this node's copy is older than
		// X's (and than nothing else: pull_from, the node that pointed the
		// sender here, handed the key here before). Deciding from the copy
		// lost X's decisions (TestScaleOutThenInUnderLoad, 2026-11-25).
		eff := Effects{Next: StandingIn, Reclaim: true, Decide: true}
		switch {
		case f.ReleasedTo != "" && f.ReleasedTo != f.SelfAddr:
			eff.PullFrom = f.ReleasedTo
		case f.ReleasedTo == "" && e.From != "" && e.From != f.SelfAddr:
			eff.PullFrom = e.From
		}
		return eff
	}
	// This node owns the key in its view but had handed it on (the views
	// differed): it takes it back from where it went.
	eff := Effects{Next: Owned, Reclaim: true, Decide: true, PullStandIn: owning(e)}
	if f.ReleasedTo != "" && f.ReleasedTo != f.SelfAddr {
		eff.PullFrom = f.ReleasedTo
	}
	return eff
}

// owning reports whether e is a check this node gets as the key's owner:
// a client's, or one another node forwarded to it as the owner.
func owning(e Event) bool { return e.Kind == Check || e.Kind == Forwarded }
