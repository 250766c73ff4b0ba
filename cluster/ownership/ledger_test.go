package ownership

import (
	"slices"
	"testing"
	"time"
)

func all(uint64) bool { return true }

// The ledger names the keys decided from a time on, and says whether it
// knows everything since then: not before the node's start, not past its
// keep, and not across a drop for room.
func TestLedgerSince(t *testing.T) {
	t.Parallel()
	const start, keep = int64(1e18), 10 * time.Second
	l := NewLedger(keep, 100, start)
	l.Note(1, start+100)
	l.Note(2, start+200)
	l.Note(1, start+50) // an older decision does not move the latest back
	hs, complete, removed := l.Since(start+150, start+300, "x", all, nil)
	if !slices.Equal(hs, []uint64{2}) || !complete || removed {
		t.Errorf("since start+150: %v complete %v removed %v; want [2] true false", hs, complete, removed)
	}
	hs, _, _ = l.Since(start+100, start+300, "x", all, nil)
	slices.Sort(hs)
	if !slices.Equal(hs, []uint64{1, 2}) {
		t.Errorf("since start+100: %v, want [1 2]", hs)
	}
	hs, _, _ = l.Since(start, start+300, "x", func(h uint64) bool { return h == 2 }, nil)
	if !slices.Equal(hs, []uint64{2}) {
		t.Errorf("since start, wanting 2 only: %v", hs)
	}
	if _, complete, _ := l.Since(start-1, start+300, "x", all, nil); complete {
		t.Error("complete from before the node's start")
	}
	if _, complete, _ := l.Since(start+1, start+1+int64(keep)+1, "x", all, nil); complete {
		t.Error("complete from longer ago than its keep")
	}
	l.Removed("x", start+250)
	if _, _, removed := l.Since(start+200, start+300, "x", all, nil); !removed {
		t.Error("a member taken out of the ring after t is not reported")
	}
	if _, _, removed := l.Since(start+260, start+300, "x", all, nil); removed {
		t.Error("a member taken out before t is reported")
	}
	if _, _, removed := l.Since(start+200, start+300, "y", all, nil); removed {
		t.Error("another member is reported taken out")
	}
}

// A full ledger drops what is past its keep, and everything when that is
// not enough; it then says it does not know what came before.
func TestLedgerIsBounded(t *testing.T) {
	t.Parallel()
	const start, keep, room = int64(1e18), time.Second, 64
	l := NewLedger(keep, room, start)
	now := start
	for h := range uint64(10 * room) {
		now += int64(time.Millisecond)
		l.Note(h, now)
		if n := len(l.at); n > room {
			t.Fatalf("%d keys held, room for %d", n, room)
		}
	}
	if _, complete, _ := l.Since(start, now, "x", all, nil); complete {
		t.Error("complete from the start after keys were dropped for room")
	}
	hs, complete, _ := l.Since(l.known, now, "x", all, nil)
	if !complete || len(hs) == 0 {
		t.Errorf("since the last drop: %d keys, complete %v; want some, true", len(hs), complete)
	}
	// Spread over more than keep, old entries make room without a drop.
	l = NewLedger(keep, room, start)
	now = start
	for h := range uint64(10 * room) {
		now += int64(keep) / (room / 4)
		l.Note(h, now)
	}
	if l.known >= now-int64(keep) {
		t.Errorf("ledger dropped everything (known %d) though its entries aged out", l.known)
	}
	if _, complete, _ := l.Since(now-int64(keep), now, "x", all, nil); !complete {
		t.Error("incomplete within keep though only entries past keep were dropped")
	}
}
