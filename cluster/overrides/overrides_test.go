package overrides

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

var (
	l100 = []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: 100, WindowMS: 60_000}}
	l5   = []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: 5, WindowMS: 60_000}}
	l7   = []bucket.Limit{{Algorithm: bucket.TokenBucket, Limit: 7, WindowMS: 1000}, {Algorithm: bucket.FixedWindow, Limit: 50, WindowMS: 3_600_000}}
)

func rec(name, key string, prefix bool, lims []bucket.Limit, v uint64, origin string) Override {
	return Override{Target: Target{Name: name, Key: key, Prefix: prefix}, Limits: slices.Clone(lims), Version: v, Origin: origin, SetAt: int64(v)}
}

func tomb(name, key string, prefix bool, v uint64, origin string) Override {
	return Override{Target: Target{Name: name, Key: key, Prefix: prefix}, Deleted: true, Version: v, Origin: origin, SetAt: int64(v)}
}

func mustApply(t *testing.T, tb *Table, o Override) bool {
	t.Helper()
	ch, err := tb.Apply(o)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// A key's own override wins over every prefix, and the longest prefix over
// shorter ones; other names and non-matching keys get none.
func TestLookupPrecedence(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	if _, ok := tb.Lookup("api", "x"); ok {
		t.Fatal("an empty table found an override")
	}
	mustApply(t, tb, rec("api", "", true, l100, 1, "n1"))
	mustApply(t, tb, rec("api", "user:", true, l5, 1, "n1"))
	mustApply(t, tb, rec("api", "user:42", false, l7, 1, "n1"))
	for _, c := range []struct {
		name, key string
		want      []bucket.Limit
	}{
		{"api", "user:42", l7}, {"api", "user:43", l5}, {"api", "user:", l5}, {"api", "team:1", l100}, {"other", "user:42", nil},
	} {
		got, ok := tb.Lookup(c.name, c.key)
		if ok != (c.want != nil) || !slices.Equal(got, c.want) {
			t.Errorf("%s/%s: %v, %v; want %v", c.name, c.key, got, ok, c.want)
		}
	}
}

// The table is a last-writer-wins map: whatever order the same records
// arrive in, every table ends the same, a deletion outranks older sets and
// a set older than a deletion changes nothing.
func TestApplyOrderDoesNotMatter(t *testing.T) {
	t.Parallel()
	recs := []Override{
		rec("api", "k", false, l100, 10, "n1"),
		rec("api", "k", false, l5, 11, "n2"),
		tomb("api", "k", false, 12, "n3"),
		rec("api", "k", false, l7, 12, "n1"), // same version as the deletion: n3 > n1 wins
		rec("api", "p", true, l5, 5, "n2"),
		rec("api", "p", true, l100, 5, "n9"), // tie broken by origin
		tomb("api", "q", false, 3, "n1"),
		rec("api", "q", false, l5, 2, "n1"), // older than its deletion
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var want []Override
	for i := range 50 {
		tb := NewTable()
		order := slices.Clone(recs)
		rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, o := range order {
			mustApply(t, tb, o)
			mustApply(t, tb, o) // twice: idempotent
		}
		got := tb.List("")
		if i == 0 {
			want = got
		} else if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("order %d: %v, want %v", i, got, want)
		}
		if _, ok := tb.Lookup("api", "k"); ok {
			t.Fatal("a deleted override is in force")
		}
		if _, ok := tb.Lookup("api", "q"); ok {
			t.Fatal("a set older than its deletion came back")
		}
		if ls, _ := tb.Lookup("api", "px"); !slices.Equal(ls, l100) {
			t.Fatalf("tie on version: %v, want the larger origin's", ls)
		}
	}
	if len(want) != 1 {
		t.Fatalf("%d overrides in force, want 1 (the prefix): %v", len(want), want)
	}
}

// Each field of a bad record is refused with an error naming it, and the
// table is unchanged.
func TestValidateRefuses(t *testing.T) {
	t.Parallel()
	good := rec("api", "k", false, l5, 1, "n1")
	for _, c := range []struct {
		want string
		edit func(*Override)
	}{
		{"name is empty", func(o *Override) { o.Name = "" }},
		{"key is empty", func(o *Override) { o.Key = "" }},
		{"at least one limit", func(o *Override) { o.Limits = nil }},
		{"limits[0]: window is 0", func(o *Override) { o.Limits = []bucket.Limit{{Limit: 5}} }},
		{"limit is 0", func(o *Override) {
			o.Limits = []bucket.Limit{{Limit: 0, WindowMS: 1000, Algorithm: bucket.FixedWindow}}
		}},
		{"deletion carries no limits", func(o *Override) { o.Deleted = true }},
		{"note", func(o *Override) { o.Note = strings.Repeat("x", MaxNoteLen+1) }},
		{"note", func(o *Override) { o.Note = "\xff" }},
		{"origin", func(o *Override) { o.Origin = "" }},
		{"more than 16 limits", func(o *Override) { o.Limits = slices.Repeat(l5, 17) }},
		{"encodes to", func(o *Override) { o.Key = strings.Repeat("k", 1000) }},
	} {
		o := good
		c.edit(&o)
		tb := NewTable()
		ch, err := tb.Apply(o)
		if err == nil || !strings.Contains(err.Error(), c.want) || ch || tb.Live() != 0 {
			t.Errorf("%q: %v, changed %v", c.want, err, ch)
		}
	}
	o := good
	o.Prefix, o.Key = true, "" // every key of the name
	if _, err := NewTable().Apply(o); err != nil {
		t.Errorf("an empty prefix: %v", err)
	}
}

// At most MaxOverrides are in force: the next new target is refused, a
// change of one in force is not, and a deletion makes room.
func TestCap(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	for i := range MaxOverrides {
		mustApply(t, tb, rec("api", fmt.Sprint("k", i), false, l5, 1, "n1"))
	}
	if _, err := tb.Apply(rec("api", "new", false, l5, 1, "n1")); !errors.Is(err, ErrFull) {
		t.Fatalf("override %d: %v, want ErrFull", MaxOverrides+1, err)
	}
	if !mustApply(t, tb, rec("api", "k0", false, l100, 2, "n1")) {
		t.Fatal("a change of an override in force was refused at the cap")
	}
	mustApply(t, tb, tomb("api", "k1", false, 2, "n1"))
	if !mustApply(t, tb, rec("api", "new", false, l5, 1, "n1")) || tb.Live() != MaxOverrides {
		t.Fatalf("after a deletion: live %d", tb.Live())
	}
}

// Records survive an encoding, one at a time and as a set, and a file.
func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	recs := []Override{rec("api", "user:42", false, l7, 17, "n1"), tomb("api", "x", true, 3, "n2")}
	recs[0].Note, recs[0].SetBy = "incident 12", "certificate CN=ops"
	recs[0].Limits[0].CalendarTZ = ""
	for _, o := range recs {
		got, err := Decode(EncodeOne(o))
		if err != nil || len(got) != 1 || fmt.Sprint(got[0]) != fmt.Sprint(o) {
			t.Fatalf("one: %v, %v; want %v", got, err, o)
		}
	}
	path := filepath.Join(t.TempDir(), "overrides")
	if got, err := ReadFile(path); err != nil || got != nil {
		t.Fatalf("a missing file: %v, %v", got, err)
	}
	if err := WriteFile(path, recs); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(recs) {
		t.Fatalf("file: %v, %v", got, err)
	}
	b, _ := os.ReadFile(path)
	if err := os.WriteFile(path, b[:len(b)-5], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a cut file: %v, want an error naming it", err)
	}
}

// Decode refuses, with an error, anything that is not a valid encoding, and
// what it accepts validates and encodes back to an equivalent input.
func FuzzDecode(f *testing.F) {
	f.Add(EncodeOne(rec("api", "k", false, l7, 1, "n1")))
	f.Add(EncodeSet([]Override{rec("api", "", true, l5, 2, "n2"), tomb("b", "k", false, 3, "n3")}))
	f.Add([]byte{formatOne, '{', '}'})
	f.Add([]byte{formatSet})
	f.Add([]byte{9})
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := Decode(b)
		if err != nil {
			return
		}
		for _, o := range recs {
			if err := o.Validate(); err != nil {
				t.Fatalf("decoded an invalid record %+v: %v", o, err)
			}
		}
		again, err := Decode(EncodeSet(recs))
		if err != nil || fmt.Sprint(again) != fmt.Sprint(recs) {
			t.Fatalf("re-encoding %v: %v, %v", recs, again, err)
		}
	})
}

// Changes of one target stamped at the same moment on one node get
// distinct versions, and the table holds the last.
func TestStampOrdersChanges(t *testing.T) {
	t.Parallel()
	tb := NewTable()
	const n = 100
	versions := make(chan uint64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := rec("api", "k", false, []bucket.Limit{{Algorithm: bucket.FixedWindow, Limit: int64(i + 1), WindowMS: 1000}}, 0, "n1")
			got, err := tb.Stamp(o, 5)
			if err != nil {
				t.Error(err)
			}
			versions <- got.Version
		}()
	}
	wg.Wait()
	close(versions)
	seen, top := map[uint64]bool{}, uint64(0)
	for v := range versions {
		if seen[v] {
			t.Fatalf("version %d given twice", v)
		}
		seen[v], top = true, max(top, v)
	}
	if held, _ := tb.Get(Target{Name: "api", Key: "k"}); held.Version != top {
		t.Fatalf("the table holds version %d, want the last, %d", held.Version, top)
	}
}

// A record Stamp accepts is one every peer decodes: its size is checked
// with the version it travels with (a node's clock, 19 digits), not a
// placeholder. Before, an override within the bound with version 1 but
// over it with its real version was stored, gossiped, and refused by
// every peer.
func TestStampedRecordsDecodeAtPeers(t *testing.T) {
	t.Parallel()
	const now = 1_795_900_000_000_000_000
	o := rec("api", "k", false, l5, 1, "n1")
	o.Key += strings.Repeat("k", MaxEncodedLen-len(encodeOne(o)))
	if n := len(encodeOne(o)); n != MaxEncodedLen {
		t.Fatalf("the test's record encodes to %d bytes", n)
	}
	if _, err := NewTable().Apply(o); err != nil {
		t.Fatalf("at the bound with version 1: %v", err)
	}
	if _, err := NewTable().Stamp(o, now); err == nil || !strings.Contains(err.Error(), "encodes to") {
		t.Fatalf("stamped with version %d: %v, want refused for its size", now, err)
	}
	o.Key = o.Key[:len(o.Key)-20]
	got, err := NewTable().Stamp(o, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(EncodeOne(got)); err != nil {
		t.Fatalf("a stamped record a peer refuses: %v", err)
	}
}

func TestTruncateUTF8(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{{"abc", 5, "abc"}, {"abcdef", 3, "abc"}, {"aé", 2, "a"}, {"éé", 3, "é"}} {
		if got := TruncateUTF8(c.s, c.n); got != c.want {
			t.Errorf("TruncateUTF8(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
