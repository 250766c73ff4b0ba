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
// multi-limit check on k: the name gains a NUL (names never contain one)
// and the limit's index, so it cannot collide with a single-limit key.
func SubKey(k Key, i int) Key {
	return Key{Name: k.Name + "\x00" + strconv.Itoa(i), Key: k.Key}
}

// BaseKey returns the key a SubKey was made from (k itself otherwise).
func BaseKey(k Key) Key {
	if i := strings.IndexByte(k.Name, 0); i >= 0 {
		k.Name = k.Name[:i]
	}
	return k
}

// DecideAll applies hits to the limits lims of k atomically: every limit
// admits and all consume, or none does (bucket.DecideAllLoad). Limit i's
// state is kept under SubKey(k, i), in the same shard, so one lock covers
// them all. It returns the combined decision (bucket.Combine). ErrMoved when
// any of the keys is released.
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
			same = same && s.lookup(cacheHash(hash, keys[i].Name), keys[i], now) == es[i]
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
	if len(s.moved) > 0 {
		for i := range keys {
			if s.isMoved(keys[i], now) {
				return bucket.Decision{}, ErrMoved
			}
		}
	}
	vals := make([]bucket.State, len(es))
	states := make([]*bucket.State, len(es))
	before := make([]bucket.State, len(es))
	for i, e := range es {
		vals[i] = e.state()
		states[i], before[i] = &vals[i], vals[i]
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
