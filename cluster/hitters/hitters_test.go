package hitters

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

const t0 = int64(1_790_000_010_000_000_000) // 10 s into a half

func hash(i int) uint64 { return rand.New(rand.NewPCG(uint64(i), 7)).Uint64() }

// With fewer keys than a shard holds, every count is exact.
func TestFewKeysAreExact(t *testing.T) {
	t.Parallel()
	tr := New()
	for i := range 10 {
		for range i + 1 {
			tr.Note(hash(i), "api", fmt.Sprint("user:", i), 2, true, t0)
		}
		tr.Note(hash(i), "api", fmt.Sprint("user:", i), int64(10-i), false, t0)
	}
	tr.Note(hash(3), "api", "user:3", 0, true, t0) // a peek counts nothing
	top := tr.Top(ByAdmitted, 3, t0)
	want := []Hitter{{"api", "user:9", 20, 1, 0, 0}, {"api", "user:8", 18, 2, 0, 0}, {"api", "user:7", 16, 3, 0, 0}}
	if fmt.Sprint(top) != fmt.Sprint(want) {
		t.Fatalf("by admitted: %v, want %v", top, want)
	}
	if top := tr.Top(ByRefused, 1, t0); len(top) != 1 || top[0] != (Hitter{"api", "user:0", 2, 10, 0, 0}) {
		t.Fatalf("by refused: %v", top)
	}
}

// On a skewed stream over many more keys than the summaries hold: every
// reported count less its error is at most the key's true hits (the hits
// since it was admitted); the ten heaviest keys are the first ten
// reported, each within its error of its true hits.
func TestSummaryOnASkewedStream(t *testing.T) {
	t.Parallel()
	tr := New()
	rng := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(rng, 1.1, 1, 99_999)
	truth := map[int]int64{}
	for range 500_000 {
		k := int(zipf.Uint64())
		hits := int64(1 + rng.IntN(3))
		truth[k] += hits
		tr.Note(hash(k), "api", fmt.Sprint("user:", k), hits, true, t0)
	}
	top := tr.Top(ByAdmitted, Capacity, t0)
	for _, h := range top {
		var k int
		fmt.Sscanf(h.Key, "user:%d", &k)
		if n := truth[k]; h.Admitted-h.AdmittedError > n {
			t.Fatalf("key %d: %d hits, reported %d with error %d: more than the hits since its admission", k, n, h.Admitted, h.AdmittedError)
		}
	}
	keys := slices.Collect(maps.Keys(truth))
	slices.SortFunc(keys, func(a, b int) int { return cmp.Compare(truth[b], truth[a]) })
	for i, k := range keys[:10] {
		h := top[i]
		if h.Key != fmt.Sprint("user:", k) || h.Admitted < truth[k]-h.AdmittedError || h.Admitted > truth[k]+h.AdmittedError {
			t.Fatalf("heaviest %d: key %d with %d hits; reported %v", i, k, truth[k], h)
		}
		t.Logf("heaviest %d: key %d, %d hits, reported %d (error %d)", i, k, truth[k], h.Admitted, h.AdmittedError)
	}
	t.Logf("%d keys, 500000 decisions, %d reported", len(truth), len(top))
}

// A key that turns heavy once the summaries are full of light keys, whose
// smallest count is then large, is still admitted and listed first,
// within its error of its true hits.
func TestLateHeavyKey(t *testing.T) {
	t.Parallel()
	tr := New()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300_000 {
		k := rng.IntN(50_000)
		tr.Note(hash(k), "api", fmt.Sprint("user:", k), 1, true, t0)
	}
	const late = 5000
	for i := range late {
		tr.Note(hash(-1), "api", "late", 1, true, t0)
		if i%3 == 0 { // the light keys go on meanwhile
			k := rng.IntN(50_000)
			tr.Note(hash(k), "api", fmt.Sprint("user:", k), 1, true, t0)
		}
	}
	top := tr.Top(ByAdmitted, 2, t0)
	if h := top[0]; h.Key != "late" || h.Admitted-h.AdmittedError > late || h.Admitted+h.AdmittedError < late {
		t.Fatalf("the late heavy key: %v, want first with %d hits within its error", top, late)
	}
	t.Logf("late key: %d hits, reported %d (error %d); next: %v", late, top[0].Admitted, top[0].AdmittedError, top[1])
}

// A key's hits count for two halves, then drop out.
func TestHalves(t *testing.T) {
	t.Parallel()
	tr := New()
	tr.Note(1, "a", "k", 5, true, t0)
	tr.Note(1, "a", "k", 1, false, t0+Half) // the next half
	if top := tr.Top(ByAdmitted, 5, t0+Half); len(top) != 1 || top[0].Admitted != 5 || top[0].Refused != 1 {
		t.Fatalf("one half later: %v", top)
	}
	if top := tr.Top(ByAdmitted, 5, t0+2*Half); len(top) != 0 {
		t.Fatalf("two halves later, the first half's hits still count: %v", top)
	}
	if top := tr.Top(ByRefused, 5, t0+2*Half); len(top) != 1 || top[0].Refused != 1 {
		t.Fatalf("two halves later, the second half's: %v", top)
	}
	if top := tr.Top(ByRefused, 5, t0+3*Half); len(top) != 0 {
		t.Fatalf("three halves later: %v", top)
	}
	tr.Note(2, "a", "j", 1, true, t0+3*Half)
	if top := tr.Top(ByAdmitted, 5, t0+10*Half); len(top) != 0 {
		t.Fatalf("after an idle stretch: %v", top)
	}
}

// Notes and Tops from many goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	t.Parallel()
	tr := New()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 5000 {
				tr.Note(hash(i%300), "api", fmt.Sprint("k", i%300), 1, g%2 == 0, t0+int64(i)*1e6)
				if i%500 == 0 {
					tr.Top(ByAdmitted, 10, t0+int64(i)*1e6)
				}
			}
		})
	}
	wg.Wait()
	var sum int64
	for _, h := range tr.Top(ByAdmitted, Capacity, t0+5000*1e6) {
		sum += h.Admitted + h.Refused
	}
	if sum != 8*5000 {
		t.Fatalf("counted %d hits of %d (300 keys fit: counts are exact)", sum, 8*5000)
	}
}

// BenchmarkNote: one decision noted, over 100,000 keys taken at random
// (every Note a replacement) and over one hot key.
func BenchmarkNote(b *testing.B) {
	hashes := make([]uint64, 100_000)
	for i := range hashes {
		hashes[i] = hash(i)
	}
	b.Run("many_keys", func(b *testing.B) {
		tr := New()
		i := 0
		for b.Loop() {
			tr.Note(hashes[i%len(hashes)], "api", "user:12345", 1, true, t0)
			i += 7919
		}
	})
	b.Run("hot_key", func(b *testing.B) {
		tr := New()
		for b.Loop() {
			tr.Note(hashes[0], "api", "user:12345", 1, true, t0)
		}
	})
}
