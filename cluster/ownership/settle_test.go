package ownership

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback/key"
)

// rounds drives s as a node does, answering each pull with answer (which
// returns an error flag, whether the node held a copy, and what else it
// said) and telling s timeLeft between rounds, and returns the pulls made,
// round by round, as "addr" or "addr!" (with release).
func rounds(s *Settle, timeLeft bool, answer func(to keymove.Holder, k int) (failed, copied bool, ans keymove.PullAnswer)) [][]string {
	var made [][]string
	for pulls := s.Next(true); len(pulls) > 0; pulls = s.Next(timeLeft) {
		var round []string
		for _, p := range pulls {
			name := p.To.Addr
			if p.To.Release {
				name += "!"
			}
			round = append(round, name)
			copies := make([]bool, len(p.Keys))
			ans := make([]keymove.PullAnswer, len(p.Keys))
			failed := false
			for j, k := range p.Keys {
				var f bool
				f, copies[j], ans[j] = answer(p.To, k)
				failed = failed || f
			}
			if failed {
				s.Failed(p)
			} else {
				s.Answered(p, copies, ans)
			}
		}
		made = append(made, round)
	}
	return made
}

// A settle asks its planned nodes, then the nodes their answers name:
// where the key was released to (with release) and the holders the
// answering node would have asked (as it would have), each once, never
// itself; and it stops after MaxPullRounds rounds whatever the answers
// name.
func TestSettleFollowsTheAnswers(t *testing.T) {
	t.Parallel()
	s := NewSettle("self:1", false)
	s.Add(1, key.Key{Name: "api", Key: "a"}, keymove.Holder{Addr: "a:1", Release: true}, keymove.Holder{Addr: "b:1"})
	s.Add(2, key.Key{Name: "api", Key: "b"}, keymove.Holder{Addr: "a:1", Release: true})
	made := rounds(s, true, func(to keymove.Holder, k int) (bool, bool, keymove.PullAnswer) {
		switch {
		case to.Addr == "a:1" && k == 0:
			// Released to c, and would have asked d and itself (self).
			return false, true, keymove.PullAnswer{MovedTo: "c:1", Holders: []keymove.Holder{{Addr: "d:1"}, {Addr: "self:1", Release: true}}}
		case to.Addr == "b:1":
			// Names a, already asked with release, and c, named by a.
			return false, false, keymove.PullAnswer{MovedTo: "a:1", Holders: []keymove.Holder{{Addr: "c:1", Release: true}}}
		case to.Addr == "c:1":
			// A third round would ask e: there is none.
			return false, true, keymove.PullAnswer{MovedTo: "e:1"}
		}
		return false, false, keymove.PullAnswer{}
	})
	want := [][]string{{"a:1!", "b:1"}, {"c:1!", "d:1"}}
	if fmt.Sprint(made) != fmt.Sprint(want) {
		t.Errorf("pulls %v, want %v", made, want)
	}
	// e, named in the last round, is on the list but never pulled.
	if got := s.Asked(0); got != 5 {
		t.Errorf("key a has %d nodes to ask, want 5 (a, b, c, d, e)", got)
	}
	if got := s.Asked(1); got != 1 {
		t.Errorf("key b asked %d nodes, want 1", got)
	}
}

// A pull that failed is made again in the next round only in an owner's
// settle, and only when the caller's deadline leaves time for it.
func TestSettleRetriesFailedPullsForTheOwner(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		owner, timeLeft bool
		want            string
	}{
		{true, true, "[[a:1! b:1] [a:1!]]"},
		{true, false, "[[a:1! b:1]]"},
		{false, true, "[[a:1! b:1]]"},
	} {
		s := NewSettle("self:1", tc.owner)
		s.Add(1, key.Key{Name: "api", Key: "a"}, keymove.Holder{Addr: "a:1", Release: true}, keymove.Holder{Addr: "b:1"})
		made := rounds(s, tc.timeLeft, func(to keymove.Holder, _ int) (bool, bool, keymove.PullAnswer) {
			return to.Addr == "a:1", false, keymove.PullAnswer{}
		})
		if got := fmt.Sprint(made); got != tc.want {
			t.Errorf("owner %v, time left %v: pulls %s, want %s", tc.owner, tc.timeLeft, got, tc.want)
		}
	}
}

// Finish leaves a key unsettled, in an owner's settle only, when no node
// told anything of it (a copy, or the "none" of a node asked with
// release) while one that did not answer is still a member.
func TestSettleFinishDefers(t *testing.T) {
	t.Parallel()
	cur := table(t, "a", "b", "c")
	k := key.Key{Name: "api", Key: "k"}
	a, b := keymove.Holder{Addr: "a:1", Release: true}, keymove.Holder{Addr: "b:1"}
	for _, tc := range []struct {
		name   string
		owner  bool
		asked  []keymove.Holder
		failed string // the address whose pulls fail
		copied string // the address that holds a copy
		tbl    *ring.Table
		member string // the member deferred for ("": not deferred)
	}{
		{"every pull answered", true, []keymove.Holder{a, b}, "", "", cur, ""},
		{"a failed, b empty without release", true, []keymove.Holder{a, b}, "a:1", "", cur, "a:1"},
		{"b failed, a's released none", true, []keymove.Holder{a, b}, "b:1", "", cur, ""},
		{"a failed, b had a copy", true, []keymove.Holder{a, b}, "a:1", "b:1", cur, ""},
		{"a failed, not the owner's settle", false, []keymove.Holder{a, b}, "a:1", "", cur, ""},
		{"a failed and is no longer a member", true, []keymove.Holder{a, b}, "a:1", "", table(t, "b", "c"), ""},
	} {
		s := NewSettle("c:1", tc.owner)
		s.Add(7, k, tc.asked...)
		rounds(s, false, func(to keymove.Holder, _ int) (bool, bool, keymove.PullAnswer) {
			return to.Addr == tc.failed, to.Addr == tc.copied, keymove.PullAnswer{}
		})
		d := s.Finish(tc.tbl, false)
		switch {
		case tc.member == "" && len(d) > 0:
			t.Errorf("%s: deferred %+v", tc.name, d)
		case tc.member != "" && (len(d) != 1 || d[0] != Deferral{Key: 0, Member: tc.member}):
			t.Errorf("%s: deferred %+v, want key 0 for %s", tc.name, d, tc.member)
		}
	}
}

// Finish settles the keys for their moves unless the caller gave up or
// the key is left unsettled; a pause's move never leaves one unsettled.
func TestSettleFinishSettles(t *testing.T) {
	t.Parallel()
	old, cur := table(t, "a", "b", "c"), table(t, "a", "b", "c", "d")
	const now = int64(1e18)
	k, h := keyOwnedBy(t, old, cur, "a", "d")
	for _, tc := range []struct {
		name      string
		fail      bool
		cancelled bool
		settled   bool
	}{
		{"answered", false, false, true},
		{"answered, the caller gave up", false, true, false},
		{"every pull failed", true, false, false},
	} {
		b := NewBook("d", window, noRelease)
		if gained, _ := b.TableChanged(old, cur, now); !gained {
			t.Fatal("d gained nothing")
		}
		s := NewSettle("d:1", true)
		s.Add(h, k)
		s.Plan(b.Moves(), "d", cur, now)
		if s.Asked(0) == 0 {
			t.Fatal("the plan asks nobody")
		}
		rounds(s, false, func(keymove.Holder, int) (bool, bool, keymove.PullAnswer) {
			return tc.fail, false, keymove.PullAnswer{}
		})
		d := s.Finish(cur, tc.cancelled)
		if got := !b.Unsettled(h, k, now); got != tc.settled {
			t.Errorf("%s: settled %v, want %v (deferred %+v)", tc.name, got, tc.settled, d)
		}
	}
	// A pause's move: every pull fails, and the key is settled all the
	// same.
	prev := table(t, "b", "c")
	p := NewBook("a", window, noRelease)
	p.Paused(prev, old, now, now)
	pk, ph := keyOwnedBy(t, prev, old, "b", "a")
	s := NewSettle("a:1", true)
	s.Add(ph, pk)
	s.Plan(p.Moves(), "a", old, now)
	if s.Asked(0) == 0 {
		t.Fatal("the pause's plan asks nobody")
	}
	rounds(s, false, func(keymove.Holder, int) (bool, bool, keymove.PullAnswer) { return true, false, keymove.PullAnswer{} })
	if d := s.Finish(old, false); len(d) > 0 {
		t.Errorf("a pause's move left a key unsettled: %+v", d)
	}
	if p.Unsettled(ph, pk, now) {
		t.Error("a pause's key is not settled")
	}
}
