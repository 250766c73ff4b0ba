package writeback

// DropExpiredReleases drops every release that ended at or before now and
// returns how many it dropped. Release drops expired releases only as the
// map of releases grows, and a lookup only for the key it looks up, so
// without this the releases of a membership change's window would stay in
// memory until the next change (one entry per key pulled from this node:
// tens of MB after a change under load). The cluster's sweeper calls it.
func (c *Cache) DropExpiredReleases(now int64) int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		dropped := 0
		for k, r := range s.moved {
			if r.until <= now {
				delete(s.moved, k)
				dropped++
			}
		}
		n += dropped
		if len(s.moved) == 0 && dropped > 0 {
			// A map keeps its buckets after deletes: start a small one.
			s.moved = map[Key]release{}
		}
		s.movedSweepAt = 2 * len(s.moved)
		s.mu.Unlock()
	}
	return n
}
