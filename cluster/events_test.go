package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestRecentEvents: the roster keeps the last RecentEvents membership
// changes, newest first, with the kinds and times they happened at.
func TestRecentEvents(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0
	r := &roster{now: func() time.Time { now = now.Add(time.Second); return now }}
	x := &memberlist.Node{Name: "x", Meta: encodeMeta(meta{grpcAddr: "x:1"})}
	y := &memberlist.Node{Name: "y", Meta: encodeMeta(meta{grpcAddr: "y:1", leaving: true})}
	if got := r.recentEvents(); len(got) != 0 {
		t.Fatalf("no events yet, got %v", got)
	}
	r.joined(x)
	r.suspected("x")
	r.answered("x")
	r.departed(x) // not leaving: failed
	r.joined(x)   // back from the dead
	r.joined(y)
	r.departed(y) // announced leaving
	r.updated(y)  // metadata updates are not kept
	want := []string{"y left", "y joined", "x rejoined", "x failed", "x alive", "x suspect", "x joined"}
	got := r.recentEvents()
	if len(got) != len(want) {
		t.Fatalf("got %d events %v, want %v", len(got), got, want)
	}
	for i, e := range got {
		if s := e.Member + " " + e.Kind; s != want[i] {
			t.Errorf("event %d: %q, want %q", i, s, want[i])
		}
		if wantT := t0.Add(time.Duration(len(want)-i) * time.Second); !e.Time.Equal(wantT) {
			t.Errorf("event %d at %v, want %v", i, e.Time, wantT)
		}
	}

	// Past RecentEvents, the oldest are dropped.
	for i := range 2 * RecentEvents {
		r.joined(&memberlist.Node{Name: fmt.Sprintf("m%03d", i)})
	}
	got = r.recentEvents()
	if len(got) != RecentEvents {
		t.Fatalf("kept %d events, want %d", len(got), RecentEvents)
	}
	if got[0].Member != fmt.Sprintf("m%03d", 2*RecentEvents-1) || got[RecentEvents-1].Member != fmt.Sprintf("m%03d", RecentEvents) {
		t.Fatalf("kept %s..%s, want the last %d", got[0].Member, got[RecentEvents-1].Member, RecentEvents)
	}
}
