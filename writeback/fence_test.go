package writeback

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// TestExpiredReleasesAreDropped: a release is dropped when its key is
// looked up after it expired, but most released keys are never looked up
// again on this node. Releasing many keys, each expired before the next
// one is released, must keep every shard's record of releases within
// twice the releases in force plus the sweep threshold, not grow with
// every key ever released; releases still in force survive the sweeps.
func TestExpiredReleasesAreDropped(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Size: 1024, Shards: 4})
	const n = 20_000
	ttl := time.Millisecond
	now := int64(1_000_000_000)
	live := Key{Name: "api", Key: "still-moving"}
	c.Fence(hashKey(live), live, now, time.Hour)
	for i := range n {
		k := Key{Name: "api", Key: fmt.Sprint("k", i)}
		now += int64(2 * ttl) // the previous release has expired
		if _, _, err := c.Fence(hashKey(k), k, now, ttl); err != nil {
			t.Fatal(err)
		}
	}
	total, most := 0, 0
	for _, s := range c.shards {
		s.mu.Lock()
		total += len(s.fences)
		most = max(most, len(s.fences))
		s.mu.Unlock()
	}
	// In force at the end: the hour-long release and the last one. A
	// shard sweeps when it reaches max(2 × its size after the last sweep,
	// minFenceSweep), so it never holds more than minFenceSweep + 2 × 2.
	bound := minFenceSweep + 4
	t.Logf("%d keys released one after another: %d releases recorded in all, at most %d in one shard (bound %d)", n, total, most, bound)
	if most > bound {
		t.Errorf("a shard records %d releases, want at most %d", most, bound)
	}
	if !c.Fenced(hashKey(live), live, now) {
		t.Error("a release still in force was dropped by a sweep")
	}
}

// FenceIfDeciding fences a key this cache decides, like Fence, and refuses
// one that is fenced already, changing nothing.
func TestFenceIfDeciding(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{Name: "n", Key: "k"}
	h := hashKey(k)
	decide(t, c, k, lim10, 3, base)
	rec, held, err := c.FenceIfDeciding(h, k, base+1, time.Minute)
	if err != nil || !held || rec.State.Count != 3 {
		t.Fatalf("first fence: %+v %v %v, want the record of 3 hits", rec, held, err)
	}
	if _, held, err := c.FenceIfDeciding(h, k, base+2, time.Hour); !errors.Is(err, ErrFenced) || held {
		t.Fatalf("second fence: held %v, err %v; want ErrFenced", held, err)
	}
	// The refused call did not stretch the fence to an hour.
	if c.Fenced(h, k, base+1+int64(time.Minute)) {
		t.Error("the refused fence changed the fence in force")
	}
	if _, _, err := c.FenceIfDeciding(h, k, base+1+int64(time.Minute), time.Minute); err != nil {
		t.Errorf("after the fence ended: %v", err)
	}
}

// Install of a record that changes nothing (not newer than what the cache
// holds, and no merge rule that adds to it) leaves a fence in force: the
// node the key was released to took the state and decides the key, and a
// stale copy handed here — a leaving node pushes every record of its store
// to the keys' next owners, replica copies among them — is no reason to
// decide it here again. Lifting the fence let this cache decide from the
// state it had released, and the hits decided since by the node it went
// to were lost (TestRollingDeployAtScale, phase B). A record that is newer
// is adopted and ends the release.
func TestInstallOfAStaleRecordKeepsTheFence(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{Name: "n", Key: "k"}
	h := hashKey(k)
	decide(t, c, k, lim10, 1, base)
	old, _, _ := c.Get(h, k, base)
	decide(t, c, k, lim10, 2, base+1)
	rec, _, err := c.Fence(h, k, base+2, time.Minute)
	if err != nil || rec.State.Count != 3 {
		t.Fatalf("fence: %+v %v", rec, err)
	}
	for _, stale := range []Record{old, rec} {
		if c.Install(h, stale) {
			t.Fatalf("installed %+v over %+v", stale, rec)
		}
		if !c.Fenced(h, k, base+3) {
			t.Fatalf("Install of a record of %d hits (version %d) lifted the fence of the key holding %d (version %d)",
				stale.State.Count, stale.Version, rec.State.Count, rec.Version)
		}
	}
	newer := rec
	newer.State.Count, newer.Version = 5, rec.Version+10
	if !c.Install(h, newer) || c.Fenced(h, k, base+3) {
		t.Fatal("a newer record was not adopted, or left the fence in force")
	}
	if d := decide(t, c, k, lim10, 1, base+4); d.Remaining != 4 {
		t.Fatalf("after the newer record: remaining %d, want 4 (5 + 1 of 10)", d.Remaining)
	}
}

// A handoff of the very record held (the sender's replica copy of it)
// installs nothing and reports it held: the receiver holds the sender's
// last count. A release stands unless the record comes back from the node
// it was released to (endRelease); an older record is never held.
func TestInstallHandedReportsTheRecordHeld(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8})
	k := Key{Name: "n", Key: "k"}
	h := hashKey(k)
	decide(t, c, k, lim10, 1, base)
	old, _, _ := c.Get(h, k, base)
	decide(t, c, k, lim10, 2, base+1)
	cur, _, _ := c.Get(h, k, base+1)
	if installed, held := c.InstallHanded(h, old, true); installed || held {
		t.Fatalf("an older record: installed %v, held %v; want neither", installed, held)
	}
	if installed, held := c.InstallHanded(h, cur, false); installed || !held {
		t.Fatalf("the record held, no release: installed %v, held %v; want held", installed, held)
	}
	rec, _, err := c.Fence(h, k, base+2, time.Minute)
	if err != nil || rec != cur {
		t.Fatalf("fence: %+v %v, want %+v", rec, err, cur)
	}
	if installed, held := c.InstallHanded(h, cur, false); installed || held || !c.Fenced(h, k, base+3) {
		t.Fatalf("the record held, released elsewhere: installed %v, held %v, fenced %v; want neither, the release standing",
			installed, held, c.Fenced(h, k, base+3))
	}
	if installed, held := c.InstallHanded(h, cur, true); installed || !held || c.Fenced(h, k, base+3) {
		t.Fatalf("the record held, handed back by the node it was released to: installed %v, held %v, fenced %v; want held, the release ended",
			installed, held, c.Fenced(h, k, base+3))
	}
	if d := decide(t, c, k, lim10, 1, base+4); d.Remaining != 6 {
		t.Fatalf("after the handoff: remaining %d, want 6 (3 + 1 of 10)", d.Remaining)
	}
}

// A replica copy is not sent on (Merge reports no change), but a handoff
// of the record held is: its sender replicated it to its own replica set,
// and the receiver, the key's owner now, must send it to its own
// (clustertest's TestHandedKeyReachesTheNewReplica).
func TestHeldHandoffGoesToTheNextRound(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 8, TrackChanges: true})
	k := Key{Name: "n", Key: "k"}
	h := hashKey(k)
	rec := Record{Key: k, State: bucket.State{Algorithm: bucket.SlidingWindow, Start: base, Count: 4, Expires: base + 120e9}, Version: 7}
	taken := func() []Record {
		var got []Record
		c.TakeChanged(base, func(_ uint64, r Record) { got = append(got, r) })
		return got
	}
	if !c.Merge(h, rec) {
		t.Fatal("the replica copy was not merged")
	}
	if got := taken(); len(got) != 0 {
		t.Fatalf("a replica copy went to the next round: %+v", got)
	}
	if installed, held := c.InstallHanded(h, rec, true); installed || !held {
		t.Fatalf("the handoff of the copy held: installed %v, held %v; want held", installed, held)
	}
	if got := taken(); len(got) != 1 || got[0] != rec {
		t.Fatalf("after the handoff of the record held, the next round takes %+v, want %+v", got, rec)
	}
}

// RangeStoredOnly gives the live records of the store whose keys are not
// in memory: with Range, every key once, whether or not it fits.
func TestRangeStoredOnlyGivesTheKeysNotInMemory(t *testing.T) {
	t.Parallel()
	c, _ := newTestCache(t, Config{Shards: 1, Size: 4, Copies: 0})
	var keys []Key
	for i := range 12 {
		k := Key{Name: "n", Key: fmt.Sprint("k", i)}
		keys = append(keys, k)
		decide(t, c, k, lim10, 1, base)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	seen := map[Key]int{}
	c.Range(base, func(r Record) bool { seen[r.Key]++; return true })
	inMemory := len(seen)
	if inMemory == 0 || inMemory >= len(keys) {
		t.Fatalf("%d of %d keys in memory; the test wants some in the store only", inMemory, len(keys))
	}
	stored := 0
	if err := c.RangeStoredOnly(base, hashKey, nil, func(r Record) bool { seen[r.Key]++; stored++; return true }); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if seen[k] != 1 {
			t.Errorf("key %s seen %d times by Range and RangeStoredOnly, want once", k.Key, seen[k])
		}
	}
	if stored != len(keys)-inMemory {
		t.Errorf("RangeStoredOnly gave %d records, want %d (%d keys, %d in memory)", stored, len(keys)-inMemory, len(keys), inMemory)
	}
	// A record no longer live is not given.
	n := 0
	if err := c.RangeStoredOnly(base+int64(2*time.Hour), hashKey, nil, func(Record) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("RangeStoredOnly gave %d expired records", n)
	}
}

// RangeStoredOnly reads the store only while a key may have left memory
// since a call last found every stored key there.
func TestRangeStoredOnlyReadsTheStoreOnlyWhenKeysLeftMemory(t *testing.T) {
	t.Parallel()
	st := &countingStore{Store: newMemStore()}
	c, err := New(Config{Shards: 1, Size: 4, Logger: quietLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(t.Context()) })
	scan := func() (given, reads int) {
		before := st.forEach.Load()
		if err := c.RangeStoredOnly(base, hashKey, nil, func(Record) bool { given++; return true }); err != nil {
			t.Fatal(err)
		}
		return given, int(st.forEach.Load() - before)
	}
	for i := range 3 {
		decide(t, c, Key{Name: "n", Key: fmt.Sprint("k", i)}, lim10, 1, base)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if given, reads := scan(); given != 0 || reads != 1 {
		t.Fatalf("every key in memory, the first call: %d given, %d store reads; want none and one", given, reads)
	}
	if given, reads := scan(); given != 0 || reads != 0 {
		t.Fatalf("every key in memory, as the last call found: %d given, %d store reads; want none", given, reads)
	}
	for i := 3; i < 8; i++ { // 4 fit: some leave memory
		decide(t, c, Key{Name: "n", Key: fmt.Sprint("k", i)}, lim10, 1, base)
	}
	if err := c.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if given, reads := scan(); given == 0 || reads != 1 {
		t.Fatalf("keys left memory: %d given, %d store reads; want some and one", given, reads)
	}
	if given, reads := scan(); given == 0 || reads != 1 {
		t.Fatalf("the keys are still only in the store: %d given, %d store reads; want some and one", given, reads)
	}

	// A cache made over a store that holds records reads it.
	c2, err := New(Config{Shards: 1, Size: 64, Logger: quietLogger()}, st)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := c2.RangeStoredOnly(base, hashKey, nil, func(Record) bool { n++; return true }); err != nil || n != 8 {
		t.Fatalf("a new cache over a store of 8 records: %d given (%v), want 8", n, err)
	}
}

// countingStore counts ForEach calls.
type countingStore struct {
	Store
	forEach atomic.Int64
}

func (s *countingStore) ForEach(fn func(Record) bool) error {
	s.forEach.Add(1)
	return s.Store.ForEach(fn)
}
