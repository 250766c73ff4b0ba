// Package hitters keeps, on each node, the keys that took the most hits in
// the last minute: the heaviest by admitted hits and the heaviest by
// refused hits, in bounded memory, whatever the number of keys.
//
// Each is a space-saving summary (Metwally, Agrawal and El Abbadi, 2005):
// at most Capacity keys, each with a count and an error. A key not in the
// summary takes the place of the one with the smallest count, m, and
// starts from m + hits with error m. So a count never falls short of the
// key's true hits and exceeds them by at most its error, which is at most
// N / Capacity for N hits counted; every key with more than N / Capacity
// hits is in the summary. A Tracker splits keys over Shards summaries by
// hash (a lock each), so the bound is per shard: N_s / (Capacity/Shards).
//
// Time runs in halves of Half (30 s): a Tracker counts into the current
// half and keeps the previous one, and Top reports both added, so a list
// covers between 30 and 60 seconds of decisions.
package hitters

import (
	"cmp"
	"slices"
	"sync"
)

// The shape of a Tracker: Shards summaries of Capacity/Shards keys for
// each of admitted and refused hits, in each of two halves.
const (
	Shards   = 16
	Capacity = 1024
	perShard = Capacity / Shards
	// Half is the length of a half, in nanoseconds.
	Half = int64(30e9)
)

// Hitter is a key's hits over the last halves: Admitted and Refused are
// at least its true hits and at most AdmittedError and RefusedError more.
// A count of 0 with an error of 0 means the key was not among the
// heaviest of that kind.
type Hitter struct {
	Name, Key                   string
	Admitted, Refused           int64
	AdmittedError, RefusedError int64
}

// By orders a Top list.
type By uint8

// The orders.
const (
	ByAdmitted By = iota
	ByRefused
)

// Tracker is safe for concurrent use. The zero value is not usable: New.
type Tracker struct {
	shards [Shards]shard
}

type shard struct {
	mu    sync.Mutex
	start int64      // when the current half began
	cur   [2]summary // admitted, refused
	prev  [2]summary // the half before
}

// New returns an empty Tracker.
func New() *Tracker {
	t := &Tracker{}
	for i := range t.shards {
		for k := range 2 {
			t.shards[i].cur[k].init()
			t.shards[i].prev[k].init()
		}
	}
	return t
}

// Note counts a decision on the key (name, key), whose hash is h, made at
// now (Unix ns): hits admitted, or refused. A decision of 0 hits (a peek)
// counts nothing.
func (t *Tracker) Note(h uint64, name, key string, hits int64, admitted bool, now int64) {
	if hits <= 0 {
		return
	}
	s := &t.shards[h%Shards]
	k := 0
	if !admitted {
		k = 1
	}
	s.mu.Lock()
	s.turn(now)
	s.cur[k].add(h, name, key, hits)
	s.mu.Unlock()
}

// turn starts a new half when the current one is over, dropping the
// previous one, and both when a whole half passed without a decision.
func (s *shard) turn(now int64) {
	switch {
	case now-s.start < Half:
		return
	case now-s.start < 2*Half:
		s.cur, s.prev = s.prev, s.cur
		s.cur[0].reset()
		s.cur[1].reset()
	default:
		for k := range 2 {
			s.cur[k].reset()
			s.prev[k].reset()
		}
	}
	s.start = now - now%Half // halves aligned to the epoch, as on every node
}

// Top returns the n heaviest keys of the last halves at now, by admitted
// or refused hits, heaviest first (ties by name, then key), each with both
// of its counts.
func (t *Tracker) Top(by By, n int, now int64) []Hitter {
	if n <= 0 {
		return nil
	}
	all := map[uint64]*Hitter{}
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.turn(now)
		for _, sum := range [2]*[2]summary{&s.cur, &s.prev} {
			for k := range 2 {
				for _, e := range sum[k].heap {
					h := all[e.h]
					if h == nil {
						h = &Hitter{Name: e.name, Key: e.key}
						all[e.h] = h
					}
					if k == 0 {
						h.Admitted += e.count
						h.AdmittedError += e.err
					} else {
						h.Refused += e.count
						h.RefusedError += e.err
					}
				}
			}
		}
		s.mu.Unlock()
	}
	out := make([]Hitter, 0, len(all))
	for _, h := range all {
		if by == ByRefused && h.Refused == 0 || by == ByAdmitted && h.Admitted == 0 {
			continue
		}
		out = append(out, *h)
	}
	SortBy(out, by)
	return out[:min(n, len(out))]
}

// SortBy sorts hitters heaviest first by admitted or refused hits, ties by
// name, then key.
func SortBy(hs []Hitter, by By) {
	slices.SortFunc(hs, func(a, b Hitter) int {
		x, y := a.Admitted, b.Admitted
		if by == ByRefused {
			x, y = a.Refused, b.Refused
		}
		return cmp.Or(cmp.Compare(y, x), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Key, b.Key))
	})
}

// summary is one space-saving summary: a min-heap of at most perShard
// entries by count, with the position of each key's entry.
type summary struct {
	heap []entry
	at   map[uint64]int
}

type entry struct {
	h          uint64
	name, key  string
	count, err int64
}

func (s *summary) init() {
	s.heap = make([]entry, 0, perShard)
	s.at = make(map[uint64]int, perShard)
}

func (s *summary) reset() {
	clear(s.heap[:cap(s.heap)]) // drop the names and keys for the GC
	s.heap = s.heap[:0]
	clear(s.at)
}

func (s *summary) add(h uint64, name, key string, hits int64) {
	if i, ok := s.at[h]; ok {
		s.heap[i].count += hits
		s.down(i)
		return
	}
	if len(s.heap) < perShard {
		s.heap = append(s.heap, entry{h: h, name: name, key: key, count: hits})
		s.at[h] = len(s.heap) - 1
		s.up(len(s.heap) - 1)
		return
	}
	// Full: the key takes the place of the one with the fewest hits.
	m := s.heap[0]
	delete(s.at, m.h)
	s.heap[0] = entry{h: h, name: name, key: key, count: m.count + hits, err: m.count}
	s.at[h] = 0
	s.down(0)
}

func (s *summary) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *summary) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.at[s.heap[i].h] = i
	s.at[s.heap[j].h] = j
}

func (s *summary) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *summary) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && s.less(r, l) {
			c = r
		}
		if !s.less(c, i) {
			return
		}
		s.swap(i, c)
		i = c
	}
}
