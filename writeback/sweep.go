package writeback

// DropExpiredFences drops every fence that ended at or before now and
// returns how many it dropped. Fence drops expired fences only as the map
// of fences grows, and a lookup only for the key it looks up, so without
// this the fences of a membership change's window would stay in memory
// until the next change (one entry per key pulled from this node: tens of
// MB after a change under load). The cluster's sweeper calls it.
func (c *Cache) DropExpiredFences(now int64) int {
	n := 0
	for _, s := range c.shards {
		s.mu.Lock()
		dropped := 0
		for k, r := range s.fences {
			if r.until <= now {
				delete(s.fences, k)
				dropped++
			}
		}
		n += dropped
		if len(s.fences) == 0 && dropped > 0 {
			// A map keeps its buckets after deletes: start a small one.
			s.fences = map[Key]fence{}
		}
		s.fenceSweepAt = 2 * len(s.fences)
		s.mu.Unlock()
	}
	return n
}
