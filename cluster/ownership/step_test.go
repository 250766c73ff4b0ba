package ownership

import (
	"testing"
)

const (
	self  = "10.0.0.1:7000"
	other = "10.0.0.2:7000" // the owner in this node's view, when another node
	third = "10.0.0.3:7000" // where the key was released to
)

// The rows of docs/ownership.md's transitions table, one case each, plus
// the cases of the node's phases ("States of a key on a node"): the facts
// before the event, the event, and every effect the row lists.
func TestStepFollowsTheTransitionsTable(t *testing.T) {
	t.Parallel()
	owned := Facts{Phase: Ready, SelfAddr: self, InRing: true, Owns: true}
	unowned := Facts{Phase: Ready, SelfAddr: self, InRing: true, OwnerAddr: other}
	replica := unowned
	replica.Replica = true
	with := func(f Facts, change func(*Facts)) Facts { change(&f); return f }
	unsettled := with(owned, func(f *Facts) { f.Unsettled = true })
	releasedOwned := with(owned, func(f *Facts) { f.Released, f.ReleasedTo = true, third })
	releasedUnowned := with(unowned, func(f *Facts) { f.Released, f.ReleasedTo = true, third })
	handed := with(unowned, func(f *Facts) { f.HandedBy = other })
	leaving := func(f Facts) Facts { f.Phase = Leaving; return f }
	draining := func(f Facts) Facts { f.Phase = Draining; return f }

	cases := []struct {
		name string
		f    Facts
		e    Event
		want Effects
	}{
		// Checks, before the cache is asked.
		{"owned, check: decided", owned, Event{Kind: Check}, Effects{Next: Owned, Decide: true, PullStandIn: true}},
		{"unowned, check: forwarded to the owner", unowned, Event{Kind: Check}, Effects{Next: Unowned, Forward: true}},
		{"replica, check: forwarded to the owner", replica, Event{Kind: Check}, Effects{Next: Replica, Forward: true}},
		{"joining, check of an owned key: the joining error", with(owned, func(f *Facts) { f.InRing = false }), Event{Kind: Check}, Effects{Next: Owned, Joining: true}},
		{"joining, check of a key it had released: the joining error", with(releasedOwned, func(f *Facts) { f.InRing = false }), Event{Kind: Check}, Effects{Next: ReleasedTo, Joining: true}},
		{"joining, forwarded check: decided", with(owned, func(f *Facts) { f.InRing = false }), Event{Kind: Forwarded}, Effects{Next: Owned, Decide: true, PullStandIn: true}},
		{"unsettled, check: pulled first", unsettled, Event{Kind: Check}, Effects{Next: Owned, Settle: true, Decide: true, PullStandIn: true}},
		{"unsettled, forwarded check: pulled first", unsettled, Event{Kind: Forwarded}, Effects{Next: Owned, Settle: true, Decide: true, PullStandIn: true}},
		{"unowned, forward received: moved_to the owner", unowned, Event{Kind: Forwarded}, Effects{Next: Unowned, Redirect: other}},
		{"draining, forward of a key it does not own: moved_to the next owner", draining(unowned), Event{Kind: Forwarded}, Effects{Next: Unowned, Redirect: other}},
		{"draining, stand-in of a key it does not own: moved_to, no pull", draining(unowned), Event{Kind: StandIn, From: third}, Effects{Next: Unowned, Redirect: other}},
		{"stand-in with pull_from: pull there, decide", unowned, Event{Kind: StandIn, From: third}, Effects{Next: StandingIn, PullFrom: third, Decide: true}},
		{"stand-in with pull_from itself: no pull", unowned, Event{Kind: StandIn, From: self}, Effects{Next: StandingIn, Decide: true}},
		{"replica, forward failure: decided from the copy", replica, Event{Kind: Failover}, Effects{Next: StandingIn, Decide: true}},
		{"leaving, owned: still decided", leaving(owned), Event{Kind: Forwarded}, Effects{Next: Owned, Decide: true, PullStandIn: true}},
		{"handed here by its view's owner, check: decided", handed, Event{Kind: Check}, Effects{Next: Owned, Decide: true}},
		{"handed here by its view's owner, forward received: decided", handed, Event{Kind: Forwarded}, Effects{Next: Owned, Decide: true}},
		{"handed here by a node not its view's owner, check: forwarded", with(handed, func(f *Facts) { f.HandedBy = third }), Event{Kind: Check}, Effects{Next: Unowned, Forward: true}},
		{"handed here by a node not its view's owner, forward received: moved_to the owner", with(handed, func(f *Facts) { f.HandedBy = third }), Event{Kind: Forwarded}, Effects{Next: Unowned, Redirect: other}},
		{"draining, handed here, forward received: moved_to the owner", draining(handed), Event{Kind: Forwarded}, Effects{Next: Owned, Redirect: other}},

		// Checks the cache refused: released to X.
		{"released, owns in its view: pull X, reclaim, decide", releasedOwned, Event{Kind: Forwarded}, Effects{Next: Owned, PullFrom: third, Reclaim: true, Decide: true, PullStandIn: true}},
		{"released to itself: reclaim, decide", with(releasedOwned, func(f *Facts) { f.ReleasedTo = self }), Event{Kind: Check}, Effects{Next: Owned, Reclaim: true, Decide: true, PullStandIn: true}},
		{"released, not owned: moved_to X", releasedUnowned, Event{Kind: Forwarded}, Effects{Next: ReleasedTo, Redirect: third}},
		{"released to a node not in its table, owns in its view: moved_to X, never taken back", with(releasedOwned, func(f *Facts) { f.ReleasedToUnseen = true }), Event{Kind: Check}, Effects{Next: ReleasedTo, Redirect: third}},
		{"released to a node not in its table, forward received: moved_to X", with(releasedOwned, func(f *Facts) { f.ReleasedToUnseen = true }), Event{Kind: Forwarded}, Effects{Next: ReleasedTo, Redirect: third}},
		{"released to a node not in its table, stand-in forward: pull X, reclaim, decide", with(releasedUnowned, func(f *Facts) { f.ReleasedToUnseen = true }), Event{Kind: StandIn}, Effects{Next: StandingIn, Reclaim: true, Decide: true, PullFrom: third}},
		{"released nowhere recorded, not owned: moved_to the owner", with(releasedUnowned, func(f *Facts) { f.ReleasedTo = "" }), Event{Kind: Forwarded}, Effects{Next: ReleasedTo, Redirect: other}},
		{"released, leaving: moved_to X, never taken back", leaving(releasedOwned), Event{Kind: Check}, Effects{Next: ReleasedTo, Redirect: third}},
		{"released nowhere known, leaving and owning: reclaim, decide", leaving(with(releasedOwned, func(f *Facts) { f.ReleasedTo = "" })), Event{Kind: Check}, Effects{Next: Owned, Reclaim: true, Decide: true, PullStandIn: true}},
		{"released to X, stand-in forward: pull X, reclaim, decide", releasedUnowned, Event{Kind: StandIn}, Effects{Next: StandingIn, Reclaim: true, Decide: true, PullFrom: third}},
		{"released to X, stand-in forward with pull_from P: pull X (newer than P), reclaim, decide", releasedUnowned, Event{Kind: StandIn, From: other}, Effects{Next: StandingIn, Reclaim: true, Decide: true, PullFrom: third}},
		{"released to nowhere known, stand-in forward with pull_from P: pull P", with(releasedUnowned, func(f *Facts) { f.ReleasedTo = "" }), Event{Kind: StandIn, From: other}, Effects{Next: StandingIn, Reclaim: true, Decide: true, PullFrom: other}},
		{"released to itself, stand-in forward: no pull", with(releasedUnowned, func(f *Facts) { f.ReleasedTo = self }), Event{Kind: StandIn}, Effects{Next: StandingIn, Reclaim: true, Decide: true}},
		{"released, stand-in forward to a leaving node: moved_to X", leaving(releasedUnowned), Event{Kind: StandIn}, Effects{Next: ReleasedTo, Redirect: third}},
		{"released and not owned, forward failure: moved_to (the policy follows)", releasedUnowned, Event{Kind: Failover}, Effects{Next: ReleasedTo, Redirect: third}},
		{"released, serve policy: reclaim, decide", releasedUnowned, Event{Kind: Serve}, Effects{Next: StandingIn, Reclaim: true, Decide: true}},
		{"serve policy: decide", unowned, Event{Kind: Serve}, Effects{Next: StandingIn, Decide: true}},

		// Stepped again after the cache refused part of the effects.
		{"fenced, owned: reclaim, decide", owned, Event{Kind: Forwarded, After: Fenced}, Effects{Next: Owned, Reclaim: true, Decide: true, PullStandIn: true}},
		{"crossed once, owns in its view: pull X again, reclaim, decide", releasedOwned, Event{Kind: Forwarded, After: Crossed, Crossings: 1}, Effects{Next: Owned, PullFrom: third, Reclaim: true, Decide: true, PullStandIn: true}},
		{"crossed past the bound, owner: given up, noted", releasedOwned, Event{Kind: Forwarded, After: Crossed, Crossings: MaxCrossings + 1}, Effects{Next: ReleasedTo, Abandon: true, NoteGivenUp: true}},
		{"crossed past the bound, stand-in: given up", releasedUnowned, Event{Kind: StandIn, After: Crossed, Crossings: MaxCrossings + 1}, Effects{Next: ReleasedTo, Abandon: true}},
		{"caller gone, forwarded to the owner: given up, noted", owned, Event{Kind: Forwarded, After: Cancelled}, Effects{Next: Owned, Abandon: true, NoteGivenUp: true}},
		{"caller gone, local check: given up", owned, Event{Kind: Check, After: Cancelled}, Effects{Next: Owned, Abandon: true}},
		{"caller gone, stand-in: given up", replica, Event{Kind: StandIn, After: Cancelled}, Effects{Next: Replica, Abandon: true}},
		{"not settled: given up", unsettled, Event{Kind: Forwarded, After: NotSettled}, Effects{Next: Unsettled, Abandon: true}},
		{"fenced, table change: nothing pushed", owned, Event{Kind: Lost, After: Fenced}, Effects{Next: ReleasedTo}},

		// Pulls received.
		{"owned, pull with release: released to the puller", owned, Event{Kind: Pull, From: other, Release: true}, Effects{Next: ReleasedTo, Release: true, NoteTo: other}},
		{"replica, pull with release: released to the puller", replica, Event{Kind: Pull, From: other, Release: true}, Effects{Next: ReleasedTo, Release: true, NoteTo: other}},
		{"released to X, pull with release by Y: released to Y, answer moved_to X", releasedOwned, Event{Kind: Pull, From: other, Release: true}, Effects{Next: ReleasedTo, Release: true, NoteTo: other, MovedTo: third}},
		{"released to the puller, pulled again: no moved_to", releasedOwned, Event{Kind: Pull, From: third, Release: true}, Effects{Next: ReleasedTo, Release: true, NoteTo: third}},
		{"pull without release: the record only", owned, Event{Kind: Pull, From: other}, Effects{Next: Owned}},
		{"unsettled, pull with release: released, the answer names its holders", unsettled, Event{Kind: Pull, From: other, Release: true}, Effects{Next: ReleasedTo, Release: true, NoteTo: other, Holders: true}},
		{"unsettled, pull without release: the record and its holders", unsettled, Event{Kind: Pull, From: other}, Effects{Next: Unsettled, Holders: true}},
		{"draining, pull with release: the record only", draining(owned), Event{Kind: Pull, From: other, Release: true}, Effects{Next: Owned}},

		// Pushes and replication received.
		{"unowned, push received: adopted, settled, handed from the pusher, settled by the record held too", unowned, Event{Kind: Push, From: other}, Effects{Next: Owned, Adopt: true, MarkSettled: true, HandedFrom: other, HeldSettles: true}},
		{"released, push received: adopted (the release ends)", releasedOwned, Event{Kind: Push, From: other}, Effects{Next: Owned, Adopt: true, MarkSettled: true, HandedFrom: other}},
		{"released to the pusher, push received: adopted, settled by the record held too", with(releasedOwned, func(f *Facts) { f.ReleasedTo = other }), Event{Kind: Push, From: other}, Effects{Next: Owned, Adopt: true, MarkSettled: true, HandedFrom: other, HeldSettles: true}},
		{"draining, push received: refused", draining(unowned), Event{Kind: Push}, Effects{Next: Unowned, Stale: true}},
		{"replica, replicate received: merged", replica, Event{Kind: Replicate}, Effects{Next: Replica, Merge: true}},
		{"owned, replicate received: refused", owned, Event{Kind: Replicate}, Effects{Next: Owned, Stale: true}},
		{"unsettled, replicate received: merged (as a pull's answer)", unsettled, Event{Kind: Replicate}, Effects{Next: Unsettled, Merge: true}},
		{"draining owner, replicate received: merged", draining(owned), Event{Kind: Replicate}, Effects{Next: Owned, Merge: true}},

		// Table changes that take the key away.
		{"owned, partition moved to X: released, pushed", with(owned, func(f *Facts) { f.Owns, f.OwnerAddr = false, other }), Event{Kind: Lost}, Effects{Next: ReleasedTo, Release: true, NoteTo: other, Push: true}},
		{"released to X, partition moved to another node: not handed off", with(releasedUnowned, func(f *Facts) {}), Event{Kind: Lost}, Effects{Next: ReleasedTo}},
		{"unsettled, partition moved on: not handed off, its copy sent", with(unowned, func(f *Facts) { f.Unsettled = true }), Event{Kind: Lost}, Effects{Next: Unowned, SendCopy: true}},
	}
	for _, c := range cases {
		got := Step(c.f, c.e)
		if got != c.want {
			t.Errorf("%s:\n got  %+v\n want %+v", c.name, got, c.want)
		}
	}
}

// A check's effects end in exactly one way, whatever the facts and
// whatever became of its previous step: a decision, a redirect, a
// forward, the joining error or giving it up. A redirect never points at
// the node itself, and only a node that knows the key's state is newer
// elsewhere pulls; a check is given up only for what became of a previous
// step, and only its owner notes that it gave it up. Every combination of
// facts is tried.
func TestStepAnswersEveryCheckOneWay(t *testing.T) {
	t.Parallel()
	addrs := []string{"", self, other, third}
	for _, kind := range []Kind{Check, Forwarded, StandIn, Failover, Serve} {
		for phase := range numPhases {
			for bits := range 1 << 7 {
				for _, to := range addrs {
					for _, from := range addrs {
						f := Facts{Phase: phase, SelfAddr: self, InRing: bits&1 != 0, Owns: bits&2 != 0,
							Replica: bits&4 != 0, Unsettled: bits&8 != 0, Released: bits&16 != 0, ReleasedTo: to,
							ReleasedToUnseen: bits&32 != 0 && to != "" && to != self}
						if !f.Owns {
							f.OwnerAddr = other
							if bits&64 != 0 {
								f.HandedBy = other
							}
						}
						if !f.Released {
							f.ReleasedTo, f.ReleasedToUnseen = "", false
						}
						for _, e := range []Event{{Kind: kind, From: from}, {Kind: kind, From: from, After: Fenced},
							{Kind: kind, From: from, After: Crossed, Crossings: 1}, {Kind: kind, From: from, After: Crossed, Crossings: MaxCrossings + 1},
							{Kind: kind, From: from, After: NotSettled}, {Kind: kind, From: from, After: Cancelled}} {
							stepOneWay(t, f, e)
						}
					}
				}
			}
		}
	}
}

func stepOneWay(t *testing.T, f Facts, e Event) {
	kind := e.Kind
	eff := Step(f, e)
	if e.After == Fenced || e.After == Crossed {
		f.Released = true
	}
	if eff.Abandon {
		if e.After == Carried || e.After == Fenced || (e.After == Crossed && e.Crossings <= MaxCrossings) {
			t.Fatalf("facts %+v, event %+v: %+v gives up a check for nothing", f, e, eff)
		}
		if eff.NoteGivenUp && !f.Owns {
			t.Fatalf("facts %+v, event %+v: %+v notes a check given up by a node that does not own the key", f, e, eff)
		}
	}
	if eff.PullStandIn && (!eff.Decide || !f.Owns) {
		t.Fatalf("facts %+v, event %+v: %+v pulls a stand-in's decision it will not use", f, e, eff)
	}
	ends := 0
	for _, b := range []bool{eff.Decide, eff.Redirect != "", eff.Forward, eff.Joining, eff.Abandon} {
		if b {
			ends++
		}
	}
	if ends != 1 {
		t.Fatalf("facts %+v, event %+v: %+v ends %d ways, want 1", f, e, eff, ends)
	}
	if eff.Redirect == self || eff.PullFrom == self {
		t.Fatalf("facts %+v, event %+v: %+v points at the node itself", f, e, eff)
	}
	if eff.Reclaim && !f.Released {
		t.Fatalf("facts %+v, event %+v: %+v reclaims a key never released", f, e, eff)
	}
	if eff.Decide && f.Released && !eff.Reclaim {
		t.Fatalf("facts %+v, event %+v: %+v decides a released key without taking it back", f, e, eff)
	}
	if f.ReleasedToUnseen && eff.Reclaim && kind != StandIn && kind != Serve {
		t.Fatalf("facts %+v, event %+v: %+v takes back a key from a node whose table is newer", f, e, eff)
	}
	if (eff.Release || eff.Adopt || eff.Merge || eff.Stale || eff.Push) && kind != Pull {
		t.Fatalf("facts %+v, event %+v: %+v has effects of another event", f, e, eff)
	}
}

// A leaving node never takes back a key pulled from it when it knows where
// the key went: the puller, which owns the key in every other view, would
// decide from the same count (docs/ownership.md, "The invariant").
func TestLeavingNodeNeverReclaimsAKeyWhoseTakerItKnows(t *testing.T) {
	t.Parallel()
	for _, kind := range []Kind{Check, Forwarded, StandIn, Failover} {
		for _, owns := range []bool{false, true} {
			f := Facts{Phase: Leaving, SelfAddr: self, InRing: true, Owns: owns, Released: true, ReleasedTo: third}
			if !owns {
				f.OwnerAddr = other
			}
			if eff := Step(f, Event{Kind: kind}); eff.Reclaim || eff.Redirect != third {
				t.Errorf("%+v, event kind %d: %+v, want moved_to %s and no reclaim", f, kind, eff, third)
			}
		}
	}
}

func TestStateNames(t *testing.T) {
	t.Parallel()
	for s := Unowned; s <= StandingIn; s++ {
		if s.String() == "state(?)" || s.String() == "" {
			t.Errorf("state %d has no name", s)
		}
	}
	if State(200).String() != "state(?)" {
		t.Error("an unknown state has a name")
	}
}

// The lifecycle's transitions are those of the diagram on Phase, and
// nothing leaves Left or Refused.
func TestPhaseTransitions(t *testing.T) {
	want := map[[2]Phase]bool{
		{Starting, Joining}: true, {Starting, Left}: true,
		{Joining, Ready}: true, {Joining, Leaving}: true, {Joining, Refused}: true,
		{Ready, Leaving}: true, {Leaving, Draining}: true, {Draining, Left}: true,
	}
	for from := range numPhases + 1 {
		for to := range numPhases + 1 {
			if got := Legal(from, to); got != want[[2]Phase{from, to}] {
				t.Errorf("Legal(%v, %v) = %v", from, to, got)
			}
		}
	}
	for p := range numPhases {
		if p.Leaves() && p.Drains() {
			t.Errorf("%v both leaves and drains", p)
		}
	}
}

// A lease return is refunded only where the check is decided as things
// stand: an owned, settled key; not one to settle, pull or take back
// first, nor one owned elsewhere.
func TestDecidesAsItStands(t *testing.T) {
	t.Parallel()
	fw := Event{Kind: Forwarded}
	for _, tc := range []struct {
		name string
		f    Facts
		want bool
	}{
		{"owned", Facts{Owns: true, InRing: true}, true},
		{"owned, unsettled", Facts{Owns: true, InRing: true, Unsettled: true}, false},
		{"owned, released to another node", Facts{Owns: true, InRing: true, Released: true, ReleasedTo: "x:1"}, false},
		{"owned by another node", Facts{OwnerAddr: "x:1", InRing: true}, false},
	} {
		if got := Step(tc.f, fw).DecidesAsItStands(); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
