package writeback

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble"

	"github.com/sluicehq/sluice/bucket"
)

// testParts groups keys as the node does (the ring's partition of the
// base key's hash), in 16 partitions.
var testParts = partsOf(16)

func partsOf(n int) Partitioning {
	return Partitioning{Count: n, Of: func(k Key) int { return int(hashKey(BaseKey(k)) % uint64(n)) }}
}

// writeLayout1 writes raw keys and values into the pebble database in dir,
// as a version before stores were grouped by partition left it.
func writeLayout1(t *testing.T, dir string, kvs map[string][]byte) {
	t.Helper()
	db, err := openPebbleDB(dir, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range kvs {
		if err := db.Set([]byte(k), v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// layoutRecords makes n live records, with every fourth a sub-key of a
// multi-limit check and one key holding a NUL.
func layoutRecords(n int) []Record {
	recs := make([]Record, n)
	for i := range recs {
		k := Key{Name: "api", Key: fmt.Sprintf("user:%d", i)}
		if i%4 == 3 {
			k = SubKey(k, i%3)
		}
		if i == 5 {
			k.Key = "user:\x005"
		}
		recs[i] = Record{Key: k, Version: uint64(i + 1),
			State: bucket.State{Algorithm: bucket.FixedWindow, Start: 60e9, Count: int64(i + 1), Expires: 4e18}}
	}
	return recs
}

// inParts returns the keys of recs whose partition (p) is in want.
func inParts(recs []Record, p Partitioning, want []bool) []Key {
	var keys []Key
	for _, r := range recs {
		if want[p.Of(r.Key)] {
			keys = append(keys, r.Key)
		}
	}
	return keys
}

// checkStore holds st to holding exactly recs, each found by Load, and
// ForEachIn over every partition and over some to giving exactly the
// records of those.
func checkStore(t *testing.T, st Store, p Partitioning, recs []Record) {
	t.Helper()
	for _, r := range recs {
		got, ok, err := st.Load(r.Key)
		if err != nil || !ok || got != r {
			t.Fatalf("Load(%q) = %+v, %v, %v; want %+v", r.Key, got, ok, err, r)
		}
	}
	ps, ok := st.(PartitionScanner)
	if !ok {
		t.Fatal("the store does not implement PartitionScanner")
	}
	for _, pick := range []func(int) bool{
		func(int) bool { return true },
		func(i int) bool { return i%3 == 1 },
		func(i int) bool { return i == p.Count-1 },
		func(i int) bool { return i < 2 || i > p.Count-3 },
	} {
		want := make([]bool, p.Count)
		for i := range want {
			want[i] = pick(i)
		}
		var got []Key
		if err := ps.ForEachIn(want, func(r Record) bool { got = append(got, r.Key); return true }); err != nil {
			t.Fatal(err)
		}
		exp := inParts(recs, p, want)
		sortKeys(got)
		sortKeys(exp)
		if !slices.Equal(got, exp) {
			t.Fatalf("ForEachIn(%v) gave %d keys, want %d:\n got %q\nwant %q", want, len(got), len(exp), got, exp)
		}
	}
}

func sortKeys(ks []Key) {
	slices.SortFunc(ks, func(a, b Key) int {
		return strings.Compare(string(appendStoreKey(nil, a)), string(appendStoreKey(nil, b)))
	})
}

// A store written before stores were grouped by partition (layout 1) is
// regrouped when it opens: every record is found by Load, a scan of some
// partitions gives exactly their records, a key that does not parse is
// deleted with a log line, and the next open rewrites nothing.
func TestOpenRegroupsALayout1Store(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	recs := layoutRecords(200)
	kvs := map[string][]byte{"junk-without-separator": appendRecordValue(nil, recs[0].State, 1)}
	for _, r := range recs {
		kvs[string(appendStoreKey(nil, r.Key))] = appendRecordValue(nil, r.State, r.Version)
	}
	writeLayout1(t, dir, kvs)
	var logs logBuf
	st, err := OpenPartitionedStore(dir, slog.New(slog.NewTextHandler(&logs, nil)), testParts)
	if err != nil {
		t.Fatal(err)
	}
	checkStore(t, st, testParts, recs)
	for _, want := range []string{"regrouped the store's records by partition", "moved=200", "dropped=1", "junk-without-separator"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, layoutName)); err != nil || string(b) != layoutLine(16) {
		t.Fatalf("layout file: %q, %v", b, err)
	}
	var again logBuf
	st, err = OpenPartitionedStore(dir, slog.New(slog.NewTextHandler(&again, nil)), testParts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if strings.Contains(again.String(), "regrouped") {
		t.Errorf("the second open regrouped again:\n%s", again.String())
	}
	checkStore(t, st, testParts, recs)
}

// A store opened with another partition count is regrouped to it; so is a
// store left half regrouped (a crash: keys of both layouts, and of another
// count, with no layout file), and one an earlier version wrote layout-1
// keys to after it was regrouped (its layout file still there).
func TestOpenRegroupsOnAnotherPartitionCount(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	recs := layoutRecords(120)
	st, err := OpenPartitionedStore(dir, quietLogger(), testParts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Write(recs[:80]); err != nil {
		t.Fatal(err)
	}
	st.Close()

	five := partsOf(5)
	st, err = OpenPartitionedStore(dir, quietLogger(), five)
	if err != nil {
		t.Fatal(err)
	}
	checkStore(t, st, five, recs[:80])
	st.Close()

	// Half regrouped: the file gone, the records in 5 partitions, more
	// of layout 1 beside them; opened with 16.
	if err := os.Remove(filepath.Join(dir, layoutName)); err != nil {
		t.Fatal(err)
	}
	kvs := map[string][]byte{}
	for _, r := range recs[80:100] {
		kvs[string(appendStoreKey(nil, r.Key))] = appendRecordValue(nil, r.State, r.Version)
	}
	writeLayout1(t, dir, kvs)
	st, err = OpenPartitionedStore(dir, quietLogger(), testParts)
	if err != nil {
		t.Fatal(err)
	}
	checkStore(t, st, testParts, recs[:100])
	st.Close()

	// An earlier version ran on the store: layout-1 keys, the file kept.
	kvs = map[string][]byte{}
	for _, r := range recs[100:] {
		kvs[string(appendStoreKey(nil, r.Key))] = appendRecordValue(nil, r.State, r.Version)
	}
	writeLayout1(t, dir, kvs)
	st, err = OpenPartitionedStore(dir, quietLogger(), testParts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	checkStore(t, st, testParts, recs)
}

// RangeStoredOnly with partitions reads only those from a store grouped by
// partition: it gives the records of the wanted partitions not in memory,
// none of the others.
func TestRangeStoredOnlyReadsTheWantedPartitions(t *testing.T) {
	t.Parallel()
	st, err := OpenPartitionedStore(t.TempDir(), quietLogger(), testParts)
	if err != nil {
		t.Fatal(err)
	}
	recs := layoutRecords(300)
	if err := st.Write(recs); err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Logger: quietLogger(), Shards: 1, Size: 50}, st)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	now := recs[0].State.Start
	inMemory := map[Key]bool{}
	for _, r := range recs[:40] {
		if _, ok, err := c.Get(hashKey(r.Key), r.Key, now); err != nil || !ok {
			t.Fatalf("Get(%q): %v %v", r.Key, ok, err)
		}
		inMemory[r.Key] = true
	}
	want := make([]bool, testParts.Count)
	want[2], want[3], want[11] = true, true, true
	var exp []Key
	for _, k := range inParts(recs, testParts, want) {
		if !inMemory[k] {
			exp = append(exp, k)
		}
	}
	var got []Key
	if err := c.RangeStoredOnly(now, hashKey, want, func(r Record) bool { got = append(got, r.Key); return true }); err != nil {
		t.Fatal(err)
	}
	sortKeys(got)
	sortKeys(exp)
	if len(exp) == 0 || !slices.Equal(got, exp) {
		t.Fatalf("gave %d records, want the %d of partitions 2, 3 and 11 not in memory:\n got %q\nwant %q", len(got), len(exp), got, exp)
	}
}

// RangeIn, over a cache that lists its keys by partition, gives exactly
// the live keys in memory of the wanted partitions, each once, whatever
// has come and gone: keys decided, evicted into pending and written, copies
// merged and evicted, slots reused. Range, filtered by partition, is the
// reference. A cache without Config.Partitions gives every key.
func TestRangeInGivesTheKeysOfTheWantedPartitions(t *testing.T) {
	t.Parallel()
	const nparts = 13
	parts := partsOf(nparts)
	cfg := Config{Logger: quietLogger(), Shards: 4, Size: 64, Copies: 32,
		Partitions: nparts, PartitionOf: func(h uint64) int { return int(h % nparts) }}
	c, err := New(cfg, NewMemStore())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(t.Context())
	// A second cache makes the records merged into c as copies.
	src, err := New(Config{Logger: quietLogger(), Shards: 4, Size: 1000}, NewMemStore())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(t.Context())
	keys := layoutRecords(400)
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(round int, want []bool) {
		t.Helper()
		var exp, got []Key
		c.Range(base, func(r Record) bool {
			if want == nil || want[parts.Of(r.Key)] {
				exp = append(exp, r.Key)
			}
			return true
		})
		c.RangeIn(base, want, func(r Record) bool { got = append(got, r.Key); return true })
		sortKeys(got)
		sortKeys(exp)
		if !slices.Equal(got, exp) {
			t.Fatalf("round %d, partitions %v: RangeIn gave %d keys, Range has %d in them:\n got %q\nwant %q", round, want, len(got), len(exp), got, exp)
		}
	}
	for round := range 60 {
		for range 40 {
			k := keys[rng.IntN(len(keys))].Key
			switch rng.IntN(4) {
			case 0, 1:
				decide(t, c, k, lim10, 1, base)
			case 2:
				decide(t, src, k, lim10, 1, base)
				rec, ok, err := src.Get(hashKey(k), k, base)
				if err != nil || !ok {
					t.Fatalf("src.Get(%q): %v, %v", k, ok, err)
				}
				c.Merge(hashKey(k), rec)
			case 3:
				if err := c.Flush(t.Context()); err != nil {
					t.Fatal(err)
				}
			}
		}
		want := make([]bool, nparts)
		for p := range want {
			want[p] = rng.IntN(3) == 0
		}
		check(round, want)
		one := make([]bool, nparts)
		one[round%nparts] = true
		check(round, one)
		check(round, make([]bool, nparts))
		all := make([]bool, nparts)
		for p := range all {
			all[p] = true
		}
		check(round, all)
		check(round, nil)
	}
	if st := c.Stats(); st.Evictions == 0 {
		t.Fatalf("no key was evicted (%+v): the test did not reach the lists' removals", st)
	}

	// Without Config.Partitions, RangeIn is Range.
	var n, all int
	src.RangeIn(base, make([]bool, nparts), func(Record) bool { n++; return true })
	src.Range(base, func(Record) bool { all++; return true })
	if n != all || all == 0 {
		t.Fatalf("a cache without Partitions gave %d keys to RangeIn, want all %d", n, all)
	}
}

// A cache is refused Partitions without PartitionOf, and the reverse.
func TestPartitionsNeedPartitionOf(t *testing.T) {
	t.Parallel()
	of := func(h uint64) int { return int(h % 7) }
	for _, cfg := range []Config{{Partitions: 7}, {PartitionOf: of}, {Partitions: -1, PartitionOf: of}} {
		if _, err := New(cfg, NewMemStore()); err == nil {
			t.Errorf("New(Partitions %d, PartitionOf set %v) made a cache, want an error", cfg.Partitions, cfg.PartitionOf != nil)
		} else {
			t.Logf("Partitions %d, PartitionOf set %v: %v", cfg.Partitions, cfg.PartitionOf != nil, err)
		}
	}
}
