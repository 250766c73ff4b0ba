package lease

import "sync"

// Book records grants made outside Heat — a region's slices of a global
// limit (docs/regions.md) — so that Return takes their unspent hits back:
// each grant by (key, the receiver's name hash, when it was made), with
// the hits that may still come back. Unlike Heat's few records per pair,
// it keeps every grant until Sweep drops it: a region holds many slices
// of one key at once. Safe for concurrent use.
type Book struct {
	mu sync.Mutex
	m  map[bookKey]int64
}

type bookKey struct {
	key, from uint64
	at        int64
}

// NewBook returns an empty Book.
func NewBook() *Book { return &Book{m: map[bookKey]int64{}} }

// Record records a grant of size hits made at at.
func (b *Book) Record(key, from uint64, at, size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.m[bookKey{key, from, at}] = size
}

// Return accepts back up to hits of the grant made at at, and returns how
// many: at most what is left of it, and none for a grant it has no record
// of.
func (b *Book) Return(key, from uint64, at, hits int64) int64 {
	if hits <= 0 {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := bookKey{key, from, at}
	left, ok := b.m[k]
	if !ok {
		return 0
	}
	back := min(hits, left)
	if left -= back; left == 0 {
		delete(b.m, k)
	} else {
		b.m[k] = left
	}
	return back
}

// Sweep drops the grants made before before, and returns how many remain.
func (b *Book) Sweep(before int64) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.m {
		if k.at < before {
			delete(b.m, k)
		}
	}
	return len(b.m)
}

// Forget drops the records of the keys moved reports, every record when
// moved is nil (the ring moved them: see Heat.ForgetGrants). moved is
// called with b's lock held and must not call back into b.
func (b *Book) Forget(moved func(key uint64) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if moved == nil {
		clear(b.m)
		return
	}
	for k := range b.m {
		if moved(k.key) {
			delete(b.m, k)
		}
	}
}
