package writeback

import (
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// TestMemStoreCloneIsTheDiskAtTheCrash: a clone keeps the records written
// before it and none written after, and stays open when the original is
// closed.
func TestMemStoreCloneIsTheDiskAtTheCrash(t *testing.T) {
	t.Parallel()
	m := NewMemStore()
	a, b := Key{Name: "n", Key: "a"}, Key{Name: "n", Key: "b"}
	if err := m.Write([]Record{{Key: a, Version: 1}}); err != nil {
		t.Fatal(err)
	}
	disk := m.Clone()
	if err := m.Write([]Record{{Key: a, Version: 2}, {Key: b, Version: 1}}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, _, err := m.Load(a); err == nil {
		t.Fatal("Load on a closed store: no error")
	}
	r, ok, err := disk.Load(a)
	if err != nil || !ok || r.Version != 1 {
		t.Fatalf("clone's a = %+v, %v, %v; want version 1", r, ok, err)
	}
	if _, ok, _ := disk.Load(b); ok {
		t.Fatal("clone holds b, written after it was taken")
	}
}

// TestMemStoreDeleteExpiredResumes: DeleteExpired examines at most max
// records per call, in key order, resuming where it stopped and wrapping
// around, and deletes only the expired ones.
func TestMemStoreDeleteExpiredResumes(t *testing.T) {
	t.Parallel()
	m := NewMemStore()
	now := base
	var live bucket.State
	bucket.Decide(&live, lim10, 1, now)
	dead := bucket.State{Expires: now} // expired at now
	var recs []Record
	for i, k := range []string{"a", "b", "c", "d", "e"} {
		st := live
		if i%2 == 0 {
			st = dead
		}
		recs = append(recs, Record{Key: Key{Name: "n", Key: k}, State: st, Version: 1})
	}
	if err := m.Write(recs); err != nil {
		t.Fatal(err)
	}
	n1, _ := m.DeleteExpired(now, 2) // a (dead), b
	n2, _ := m.DeleteExpired(now, 2) // c (dead), d
	n3, _ := m.DeleteExpired(now, 2) // e (dead), then b again
	if n1 != 1 || n2 != 1 || n3 != 1 {
		t.Fatalf("deleted %d, %d, %d per call; want 1, 1, 1", n1, n2, n3)
	}
	var left []string
	m.ForEach(func(r Record) bool { left = append(left, r.Key.Key); return true })
	if len(left) != 2 || left[0] != "b" || left[1] != "d" {
		t.Fatalf("left %v, want [b d]", left)
	}
}
