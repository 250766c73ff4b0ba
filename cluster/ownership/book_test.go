package ownership

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback/key"
)

func table(t *testing.T, names ...string) *ring.Table {
	t.Helper()
	var ms []ring.Member
	for _, n := range names {
		ms = append(ms, ring.Member{Name: n, Addr: n + ":1"})
	}
	cfg := ring.DefaultConfig()
	cfg.Partitions = 127
	tb, err := ring.BuildTable(cfg, ms)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// keyOwnedBy returns a key whose owner is owner in cur and was prevOwner
// in prev.
func keyOwnedBy(t *testing.T, prev, cur *ring.Table, prevOwner, owner string) (key.Key, uint64) {
	t.Helper()
	for i := range 100000 {
		k := key.Key{Name: "api", Key: fmt.Sprint("k", i)}
		h := ring.Hash(k.Name, k.Key)
		p, _ := prev.Owner(h)
		c, _ := cur.Owner(h)
		if p.Name == prevOwner && c.Name == owner {
			return k, h
		}
	}
	t.Fatalf("no key moved from %s to %s", prevOwner, owner)
	return key.Key{}, 0
}

const window = 30 * time.Second

func noRelease(key.Key, int64) bool { return false }

// A join registers a move on the node that gains partitions, with the
// joiner's current replicas to pull when the joiner itself entered; the
// node that loses them is told to hand off. The key is unsettled on the
// gainer until it is settled or the window ends.
func TestTableChangedRegistersTheMove(t *testing.T) {
	t.Parallel()
	old, cur := table(t, "a", "b"), table(t, "a", "b", "c")
	const now = int64(1e18)
	joiner := NewBook("c", window, noRelease)
	gained, lost := joiner.TableChanged(old, cur, now)
	if !gained || lost {
		t.Fatalf("the joiner: gained %v, lost %v; want true, false", gained, lost)
	}
	k, h := keyOwnedBy(t, old, cur, "a", "c")
	if !joiner.Unsettled(h, k, now) {
		t.Fatal("a key moved to the joiner is not unsettled")
	}
	srcs, settles := joiner.Moves().Plan(h, k, "c", cur, now, nil)
	if len(settles) != 1 || !slices.Contains(srcs, keymove.Holder{Addr: "a:1", Release: true}) {
		t.Fatalf("plan %v (for %d moves), want the previous owner a with release", srcs, len(settles))
	}
	var reps []ring.Member
	for _, r := range cur.Replicas(h, reps) {
		if r.Name != "c" && !slices.Contains(srcs, keymove.Holder{Addr: r.Addr, Release: true}) {
			t.Errorf("plan %v: the key's current replica %s (the joiner entered with this change) not asked with release", srcs, r.Name)
		}
	}
	settled(k, settles)
	if joiner.Unsettled(h, k, now) {
		t.Error("a settled key is still unsettled")
	}
	k2, h2 := keyOwnedBy(t, old, cur, "b", "c")
	if !joiner.Unsettled(h2, k2, now) {
		t.Fatal("another moved key was settled too")
	}
	if joiner.Unsettled(h2, k2, now+int64(window)+1) {
		t.Error("a key is unsettled after its move's window ended")
	}
	joiner.Carried(k2, Effects{MarkSettled: true}, now)
	if joiner.Unsettled(h2, k2, now) {
		t.Error("a key handed here (Carried with MarkSettled) is still unsettled")
	}

	loser := NewBook("a", window, noRelease)
	if gained, lost := loser.TableChanged(old, cur, now); gained || !lost {
		t.Errorf("the node losing partitions: gained %v, lost %v; want false, true", gained, lost)
	}
	if len(loser.Moves()) != 0 {
		t.Error("a node that gained nothing registered a move")
	}
}

// When neither the previous owner nor any of its replicas is in the
// current table, every member left is asked, without releasing.
func TestPlanAsksEveryMemberWhenNoHolderIsLeft(t *testing.T) {
	t.Parallel()
	prev := table(t, "a", "b", "c", "d")
	cur := table(t, "a", "e", "f")
	const now = int64(1e18)
	b := NewBook("a", window, noRelease)
	b.Paused(prev, cur, now, now) // any move from prev; Paused limits it to a's keys in cur
	var k key.Key
	var h uint64
	found := false
	for i := range 100000 {
		k = key.Key{Name: "api", Key: fmt.Sprint("k", i)}
		h = ring.Hash(k.Name, k.Key)
		p, _ := prev.Owner(h)
		c, _ := cur.Owner(h)
		reps := prev.Replicas(h, nil)
		if c.Name == "a" && p.Name != "a" && !slices.ContainsFunc(reps, func(m ring.Member) bool { return HasMember(cur, m.Name) }) {
			found = true
			break
		}
	}
	if !found {
		t.Skip("no key whose holders all left (the ring's placement)")
	}
	srcs, _ := b.Moves().Plan(h, k, "a", cur, now, nil)
	for _, m := range []string{"e:1", "f:1"} {
		if !slices.Contains(srcs, keymove.Holder{Addr: m, Release: false}) && !slices.Contains(srcs, keymove.Holder{Addr: m, Release: true}) {
			t.Errorf("plan %v: member %s not asked", srcs, m)
		}
	}
}

// A pause's move applies only to the keys the node owns in the current
// table.
func TestPausedMoveAppliesToOwnedKeysOnly(t *testing.T) {
	t.Parallel()
	cur := table(t, "a", "b", "c")
	prev := table(t, "b", "c")
	const now = int64(1e18)
	b := NewBook("a", window, noRelease)
	b.Paused(prev, cur, now, now)
	mine, hm := keyOwnedBy(t, prev, cur, "b", "a")
	theirs, ht := keyOwnedBy(t, prev, cur, "b", "b")
	if !b.Unsettled(hm, mine, now) {
		t.Error("a key the paused node owns is not unsettled")
	}
	if b.Unsettled(ht, theirs, now) {
		t.Error("a key another node owns is unsettled after a pause")
	}
}

// A node that notices pauses again and again (a starved machine) keeps
// one pause move per table, and a key settled after one pause is
// unsettled again by the next.
func TestPauseMovesDoNotPileUp(t *testing.T) {
	t.Parallel()
	cur := table(t, "a", "b", "c")
	prev := table(t, "b", "c")
	other := table(t, "a", "b", "c", "d")
	const now = int64(1e18)
	b := NewBook("a", window, noRelease)
	mine, h := keyOwnedBy(t, prev, cur, "b", "a")
	for i := range 1000 {
		b.Paused(prev, cur, now+int64(i), now+int64(i))
	}
	if n := len(b.Moves()); n != 1 {
		t.Fatalf("%d moves after 1000 pauses over one table, want 1", n)
	}
	srcs, settles := b.Moves().Plan(h, mine, "a", cur, now+1000, nil)
	if len(srcs) == 0 || len(settles) != 1 {
		t.Fatalf("plan after the pauses: sources %v, %d moves to settle; want some and 1", srcs, len(settles))
	}
	settled(mine, settles)
	if b.Unsettled(h, mine, now+1000) {
		t.Fatal("settled key still unsettled")
	}
	b.Paused(prev, cur, now+2000, now+2000)
	if !b.Unsettled(h, mine, now+2000) {
		t.Error("a key settled after one pause is settled for the next")
	}
	// A pause over another table keeps the first table's move.
	b.Paused(prev, other, now+3000, now+3000)
	if n := len(b.Moves()); n != 2 {
		t.Errorf("%d moves after pauses over two tables, want 2", n)
	}
}

// A narrowed pause move applies only to the keys its peers named; a
// newer pause over the same table replaces it whole again, standing for
// the earlier gap too, and a replaced move cannot be narrowed.
func TestNarrowedPauseMove(t *testing.T) {
	t.Parallel()
	cur := table(t, "a", "b", "c")
	prev := table(t, "b", "c")
	const now = int64(1e18)
	b := NewBook("a", window, noRelease)
	named, hn := keyOwnedBy(t, prev, cur, "b", "a")
	other, ho := keyOwnedBy(t, prev, cur, "c", "a") // another of a's keys
	m := b.Paused(prev, cur, now, now-500)
	if m.Since() != now-500 {
		t.Fatalf("since %d, want %d", m.Since(), now-500)
	}
	if !b.Unsettled(ho, other, now) || !b.Unsettled(hn, named, now) {
		t.Fatal("before it is narrowed, a pause move does not apply to every owned key")
	}
	if !b.Narrow(m, map[uint64]struct{}{hn: {}}) {
		t.Fatal("the current pause move was not narrowed")
	}
	if b.Narrow(m, map[uint64]struct{}{}) {
		t.Error("a pause move was narrowed twice")
	}
	if b.Unsettled(ho, other, now) {
		t.Error("a key nobody named is unsettled after the narrowing")
	}
	if !b.Unsettled(hn, named, now) {
		t.Error("a key a peer named is settled after the narrowing")
	}
	// A newer pause: every owned key again, since the first gap's start.
	m2 := b.Paused(prev, cur, now+100, now+50)
	if m2.Since() != now-500 {
		t.Errorf("the newer pause move stands for the gaps since %d, want the first's %d", m2.Since(), now-500)
	}
	if !b.Unsettled(ho, other, now+100) {
		t.Error("after a newer pause, a key nobody named for the older one is settled")
	}
	if b.Narrow(m, map[uint64]struct{}{}) {
		t.Error("a replaced pause move was narrowed")
	}
}

// Released-to records stay within the prune threshold plus twice the
// releases in force, and the sweep keeps only those in force; moves are
// dropped once their window ended.
func TestBookRecordsAreBounded(t *testing.T) {
	t.Parallel()
	const now0 = int64(1e18)
	inForce := map[key.Key]bool{}
	b := NewBook("a", window, func(k key.Key, now int64) bool { return inForce[k] })
	live := key.Key{Name: "api", Key: "live"}
	inForce[live] = true
	b.noteReleased(live, "b:1", now0)
	const keys = 5 * MinReleasedSweep
	for i := range keys {
		b.noteReleased(key.Key{Name: "api", Key: fmt.Sprint("k", i)}, "b:1", now0+int64(i))
	}
	bound := MinReleasedSweep + 2
	if got := b.ReleasedRecords(); got > bound {
		t.Errorf("%d records after %d releases, all but one over: want at most %d", got, keys, bound)
	}
	b.TableChanged(table(t, "b", "c"), table(t, "a", "b", "c"), now0)
	if len(b.Moves()) != 1 {
		t.Fatal("no move registered")
	}
	b.Sweep(now0 + int64(window) - 1)
	if len(b.Moves()) != 1 {
		t.Error("a move in its window was swept")
	}
	b.Sweep(now0 + int64(window) + 1)
	if len(b.Moves()) != 0 || b.ReleasedRecords() != 1 {
		t.Errorf("after the window: %d moves, %d records; want 0 and 1", len(b.Moves()), b.ReleasedRecords())
	}
	if to, ok := b.ReleasedTo(live); !ok || to != "b:1" {
		t.Errorf("the release in force points to %q, want b:1", to)
	}
}

// An answer naming another node is followed once, to a node not asked and
// not itself; a node asked without release is asked again with release
// when the answer says the key went there.
func TestFollow(t *testing.T) {
	t.Parallel()
	asked := []keymove.Holder{{Addr: "a:1", Release: true}, {Addr: "b:1", Release: false}}
	for _, c := range []struct {
		to      string
		release bool
		want    bool
	}{
		{"", true, false}, {"self:1", true, false}, {"a:1", true, false}, {"a:1", false, false},
		{"b:1", false, false}, {"b:1", true, true}, {"c:1", true, true}, {"c:1", false, true},
	} {
		src, ok := Follow(asked, c.to, c.release, "self:1")
		if ok != c.want || (ok && src != (keymove.Holder{Addr: c.to, Release: c.release})) {
			t.Errorf("follow %q (release %v): %v %v, want %v", c.to, c.release, src, ok, c.want)
		}
	}
	if got := Ask(asked, "b:1", true); len(got) != 2 || !got[1].Release {
		t.Errorf("asking b again with release: %v", got)
	}
}

// A moved key's plan asks its current replicas too: a check the new owner
// could not settle (no node asked answered) failed over to the first of
// them, which decided it as a stand-in, and the owner must pull that
// decision when it settles the key.
func TestPlanAsksTheKeysCurrentReplicas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		old, cur  []string
		from, dst string
	}{
		{"leave", []string{"a", "b", "c", "d", "e"}, []string{"a", "b", "c", "d"}, "e", ""},
		{"join", []string{"a", "b", "c", "d"}, []string{"a", "b", "c", "d", "e"}, "", "e"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := table(t, tc.old...), table(t, tc.cur...)
			const now = int64(1e18)
			checked := 0
			for _, self := range tc.cur {
				if tc.dst != "" && self != tc.dst {
					continue
				}
				b := NewBook(self, window, noRelease)
				if gained, _ := b.TableChanged(old, cur, now); !gained {
					continue
				}
				for i := range 2000 {
					k := key.Key{Name: "api", Key: fmt.Sprint("k", i)}
					h := ring.Hash(k.Name, k.Key)
					if o, _ := cur.Owner(h); o.Name != self {
						continue
					}
					if p, _ := old.Owner(h); p.Name == self {
						continue
					}
					if !b.Unsettled(h, k, now) {
						t.Fatalf("%s: key %s moved to it is not unsettled", self, k.Key)
					}
					srcs, settles := b.Moves().Plan(h, k, self, cur, now, nil)
					if len(settles) == 0 {
						t.Fatalf("%s: unsettled key %s has no move to settle", self, k.Key)
					}
					for _, r := range cur.Replicas(h, nil) {
						if r.Name != self && !Asks(srcs, r.Addr) {
							t.Errorf("%s: plan %v for %s does not ask its current replica %s", self, srcs, k.Key, r.Name)
						}
					}
					checked++
				}
			}
			if checked == 0 {
				t.Fatal("no key moved")
			}
			t.Logf("%d moved keys planned", checked)
		})
	}
}

// The node changes the book only through events (a ring change, a pause,
// the answers after one, time, a settle's end, carried-out effects) and
// reads it otherwise: every exported method of Book is one of those. A
// new one must be classified here, and a setter the node would call to
// write the records itself has no place on the list.
func TestOnlyEventsWriteTheBook(t *testing.T) {
	t.Parallel()
	events := map[string]bool{"TableChanged": true, "Paused": true, "Narrow": true, "Sweep": true, "Carried": true}
	reads := map[string]bool{"Moves": true, "Unsettled": true, "ReleasedTo": true, "ReleasedRecords": true, "HandedBy": true, "HandedRecords": true}
	bt := reflect.TypeFor[*Book]()
	for i := range bt.NumMethod() {
		name := bt.Method(i).Name
		if !events[name] && !reads[name] {
			t.Errorf("Book.%s is neither an event nor a read: the records are the component's to change", name)
		}
	}
	if st := reflect.TypeFor[Book](); st.NumField() > 0 {
		for i := range st.NumField() {
			if f := st.Field(i); f.IsExported() {
				t.Errorf("Book.%s is an exported field: the records are the component's to change", f.Name)
			}
		}
	}
}

// A push's record (Facts.HandedBy) lasts until the key is released or the
// move window ends, and Sweep drops it then.
func TestHandedRecordLastsUntilReleasedOrTheWindowEnds(t *testing.T) {
	t.Parallel()
	const window = time.Second
	b := NewBook("n1", window, func(key.Key, int64) bool { return false })
	k1, k2 := key.Key{Name: "api", Key: "a"}, key.Key{Name: "api", Key: "b"}
	now := int64(1e12)
	if got := b.HandedBy(k1, now); got != "" {
		t.Fatalf("HandedBy before any push = %q", got)
	}
	push := Step(Facts{SelfAddr: "n1:1", InRing: true, OwnerAddr: "n2:1"}, Event{Kind: Push, From: "n2:1"})
	b.Carried(k1, push, now)
	b.Carried(k2, push, now)
	if got := b.HandedBy(k1, now+int64(window)); got != "n2:1" {
		t.Errorf("HandedBy at the window's end = %q, want n2:1", got)
	}
	if got := b.HandedBy(k1, now+int64(window)+1); got != "" {
		t.Errorf("HandedBy after the window = %q, want none", got)
	}
	b.Carried(k1, Effects{Release: true, NoteTo: "n3:1"}, now+1)
	if got := b.HandedBy(k1, now+1); got != "" {
		t.Errorf("HandedBy after a release = %q, want none", got)
	}
	if got := b.HandedRecords(); got != 1 {
		t.Errorf("%d handed records after one release, want 1", got)
	}
	b.Sweep(now + int64(window) + 1)
	if got := b.HandedRecords(); got != 0 {
		t.Errorf("%d handed records after the window's sweep, want 0", got)
	}
}
