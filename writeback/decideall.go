package writeback

// Several limits on one key: DecideAll decides them together, each under
// its own sub-key (SubKey, BaseKey).

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/bucket"
)

// SubKey is the key under which the cache keeps the state of limit i of a
// multi-limit check on k (0 <= i < MaxLimit): Limit i+1.
func SubKey(k Key, i int) Key {
	k.Limit = uint8(i + 1)
	return k
}

// HoldersKey returns the key of k's concurrency limit holders
// (bucket.Holders): limit index MaxLimit, which no multi-limit check
// reaches (at most bucket.MaxLimitsPerRequest limits).
func HoldersKey(k Key) Key {
	k.Limit = MaxLimit
	return k
}

// BaseKey returns the key a SubKey was made from (k itself otherwise).
func BaseKey(k Key) Key {
	k.Limit = 0
	return k
}

// KeyOf returns the Key of a counter as peers exchange it
// (bucket.ValidateCounterKey): a name with the suffix "\x00" and a decimal
// limit index is limit index+1's counter. A malformed suffix stays in the
// name (the peer layer refuses such names before they get here).
func KeyOf(c bucket.Counter) Key {
	base, idx, sub := strings.Cut(c.Name, "\x00")
	if !sub {
		return Key{Name: c.Name, Key: c.Key}
	}
	i, err := strconv.Atoi(idx)
	if err != nil || i < 0 || i >= MaxLimit {
		return Key{Name: c.Name, Key: c.Key}
	}
	return Key{Name: base, Key: c.Key, Limit: uint8(i + 1)}
}

// RecordOf returns the Record of a counter a peer sent (KeyOf).
func RecordOf(c bucket.Counter) Record {
	return Record{Key: KeyOf(c), State: c.State, Version: c.Version}
}

// CounterOf returns k as peers exchange it: limit i of a multi-limit check
// is the name with "\x00" and i appended (KeyOf reads it back).
func CounterOf(k Key) bucket.Counter {
	if k.Limit == 0 {
		return bucket.Counter{Name: k.Name, Key: k.Key}
	}
	return bucket.Counter{Name: k.Name + "\x00" + strconv.Itoa(int(k.Limit)-1), Key: k.Key}
}

// Counter returns r as peers exchange it (CounterOf).
func (r Record) Counter() bucket.Counter {
	c := CounterOf(r.Key)
	c.State, c.Version = r.State, r.Version
	return c
}

// DecideAll applies hits to the limits lims of k atomically: every limit
// admits and all consume, or none does (bucket.DecideAllLoad). Limit i's
// state is kept under SubKey(k, i), in the same shard, so one lock covers
// them all. It returns the combined decision (bucket.Combine). ErrFenced when
// any of the keys is fenced; a *bucket.AlgorithmConflict, changing nothing,
// when a limit's algorithm differs from its live state's.
func (c *Cache) DecideAll(hash uint64, k Key, lims []bucket.Limit, hits, now int64, load float64) (bucket.Decision, error) {
	s := c.shardFor(hash)
	keys := make([]Key, len(lims))
	for i := range lims {
		keys[i] = SubKey(k, i)
	}
	es := make([]*slot, len(lims))
	for attempt := 0; ; attempt++ {
		// Load every state (each find may drop the lock for a store read),
		// then check under one hold of the lock that all are still there.
		for i := range keys {
			e, err := c.find(s, hash, keys[i], now, true)
			s.mu.Unlock()
			if err != nil {
				return bucket.Decision{}, err
			}
			es[i] = e
		}
		s.mu.Lock()
		same := true
		for i := range keys {
			same = same && s.lookup(cacheHash(hash, keys[i].Limit), keys[i], now) == es[i]
		}
		if same {
			break
		}
		s.mu.Unlock()
		if attempt == 10 {
			return bucket.Decision{}, fmt.Errorf("writeback: %d limits of one key do not fit in the cache at once", len(lims))
		}
	}
	defer s.mu.Unlock()
	if len(s.fences) > 0 {
		for i := range keys {
			if s.isFenced(keys[i], now) {
				return bucket.Decision{}, ErrFenced
			}
		}
	}
	vals := make([]bucket.State, len(es))
	states := make([]*bucket.State, len(es))
	before := make([]bucket.State, len(es))
	for i, e := range es {
		vals[i] = e.state()
		states[i], before[i] = &vals[i], vals[i]
		if err := bucket.Conflict(&vals[i], &lims[i], now); err != nil {
			return bucket.Decision{}, fmt.Errorf("limit %d: %w", i, err)
		}
	}
	out := make([]bucket.Decision, len(lims))
	bucket.DecideAllLoad(states, lims, hits, now, load, out)
	for i, e := range es {
		if vals[i] != before[i] {
			e.setState(vals[i])
			s.changed(hash, e, now)
		}
	}
	return bucket.Combine(out), nil
}
