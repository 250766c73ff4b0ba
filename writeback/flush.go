package writeback

// Writing to the store: flushes, the store's health, the background loops
// and Close.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// storeHealth is what the flushes found of the store. Guarded by healthMu.
type storeHealth struct {
	since    time.Time // when the first of the failing flushes failed
	err      error     // the last failure
	failures uint64    // failed flushes since then
	logged   time.Time // the last log line about it
	quiet    bool      // its start was not logged (see noteFlush)
}

// storeLogEvery is how often a store that stays unwritable is logged again
// (the failure and the recovery are always logged).
const storeLogEvery = time.Minute

// spaceChecker is a Store that can tell, without writing, that a write
// would be refused for lack of disk space (pebbleStore). A flush asks it
// first while the store is unwritable, so that a full disk costs one free
// space check per interval rather than a copy of every dirty entry.
// CheckSpace is safe for concurrent use with every Store method.
type spaceChecker interface {
	CheckSpace() error // wraps ErrStoreFull when a write would be refused
}

// StoreState is what the flushes found of the store.
type StoreState struct {
	// Writable is false from a failed flush until a flush succeeds again.
	Writable bool
	// Since is when the first of the failing flushes failed (zero while
	// Writable).
	Since time.Time
	// Err is the last failure (nil while Writable); errors.Is(Err,
	// ErrStoreFull) when the disk is short of space.
	Err error
	// FailedFlushes is how many flushes failed since Since.
	FailedFlushes uint64
}

// flushItem is one record of a flush and where it came from.
type flushItem struct {
	s  *shard
	sl *slot
}

// Flush writes every dirty and pending entry to the store now, as one
// batch. Shard locks are held only to copy states, never during the write,
// so checks do not wait on disk. An entry changed during the write stays
// dirty. On failure every entry stays dirty for the next flush, and the
// failure is logged and counted. Flushes run one at a time.
func (c *Cache) Flush(ctx context.Context) error {
	select {
	case c.flushSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.flushSem }()
	if c.storeClosed {
		return ErrClosed
	}
	return c.flush(ctx)
}

// flush does Flush with flushSem held.
func (c *Cache) flush(ctx context.Context) error {
	if sc, ok := c.store.(spaceChecker); ok && !c.writable.Load() {
		// Entries changed since the failure stay dirty; ask the store
		// before copying them all again.
		if err := sc.CheckSpace(); err != nil {
			c.noteFlush(err, 0, time.Now())
			return err
		}
	}
	gens := make([]uint64, len(c.shards))
	recs, items := c.takeDirty(gens)
	var err error
	if len(recs) > 0 {
		if err = ctx.Err(); err == nil {
			start := time.Now()
			err = c.store.Write(recs)
			end := time.Now()
			c.noteFlush(err, len(recs), end)
			if c.cfg.OnFlush != nil {
				c.cfg.OnFlush(len(recs), end.Sub(start), err)
			}
		}
	}
	if err != nil {
		c.requeue(items)
	} else if len(recs) > 0 {
		c.flushes.Add(1)
		c.flushedRecords.Add(uint64(len(recs)))
		markWritten(items, recs)
	}
	// This flush holds no slot any more: release what waited for it.
	for si, s := range c.shards {
		s.mu.Lock()
		s.flushDone = gens[si]
		s.reap()
		s.mu.Unlock()
	}
	return err
}

// takeDirty copies every shard's dirty entries into the records to write,
// with the slots they came from, a chunk per shard-lock hold, and notes in
// gens[i] the flush's number in shard i.
func (c *Cache) takeDirty(gens []uint64) ([]Record, []flushItem) {
	var recs []Record
	var items []flushItem
	for si, s := range c.shards {
		s.mu.Lock()
		s.flushStarts++
		gens[si] = s.flushStarts
		all := s.dirty
		s.dirty, s.spare = s.spare[:0], nil
		s.mu.Unlock()
		for refs := all; len(refs) > 0; {
			chunk := refs[:min(len(refs), flushChunk)]
			refs = refs[len(chunk):]
			s.mu.Lock()
			for _, sl := range chunk {
				if !sl.has(queuedBit) {
					continue
				}
				sl.clear(queuedBit)
				recs = append(recs, Record{Key: s.keyOf(sl), State: sl.state(), Version: sl.version})
				items = append(items, flushItem{s: s, sl: sl})
			}
			s.mu.Unlock()
		}
		clear(all) // drop the references for the GC
		s.mu.Lock()
		if s.spare == nil && cap(all) <= maxSpare {
			s.spare = all[:0]
		}
		s.mu.Unlock()
	}
	return recs, items
}

// markWritten clears the dirty bit of every slot unchanged since its record
// (recs[i] for items[i]) was copied, retires the evicted ones the write
// took, and bumps each shard's writeSeq. Items come grouped by shard, and
// there is at least one.
func markWritten(items []flushItem, recs []Record) {
	var s *shard
	for i, it := range items {
		if it.s != s {
			if s != nil {
				s.writeSeq++
				s.mu.Unlock()
			}
			s = it.s
			s.mu.Lock()
		}
		// Versions only grow: the same version means no change since
		// the copy was taken.
		if sl := it.sl; sl.version == recs[i].Version && !sl.has(queuedBit) {
			sl.clear(dirtyBit)
			if p, ok := s.pending[recs[i].Key]; ok && s.slots.at(p) == sl {
				delete(s.pending, recs[i].Key)
				s.retire(p)
			}
		}
	}
	s.writeSeq++
	s.mu.Unlock()
}

// noteFlush records the outcome of a flush's write of n records at now:
// counts a failure, and logs when the store stops taking writes, at most
// every storeLogEvery while it stays so, and when it takes them again. A
// store that stops again within storeLogEvery of the last logged stop
// (free space hovering at the reserve) is not logged again before then.
// Called without any shard lock held.
func (c *Cache) noteFlush(err error, n int, now time.Time) {
	if err == nil && c.writable.Load() {
		return
	}
	c.healthMu.Lock()
	defer c.healthMu.Unlock()
	h := &c.health
	if err == nil {
		if c.writable.Load() {
			return
		}
		c.writable.Store(true)
		if !h.quiet {
			c.log.Warn("writeback: store writable again; the counters kept in memory are written",
				"records", n, "unwritable_for", now.Sub(h.since).Round(time.Millisecond), "failed_flushes", h.failures)
		}
		*h = storeHealth{}
		return
	}
	c.flushErrors.Add(1)
	h.err = err
	h.failures++
	if c.writable.Load() {
		c.writable.Store(false)
		h.since, h.logged = now, now
		if !c.downLogged.IsZero() && now.Sub(c.downLogged) < storeLogEvery {
			// A store that flaps at the edge of its reserve: this start
			// and its end go unlogged, the reminder below still comes.
			h.quiet, h.logged = true, c.downLogged
			return
		}
		c.downLogged = now
		c.log.Error("writeback: flush failed, the store is not writable; changed counters stay in memory "+
			"(and on replicas) and are written when it is; retried every flush interval",
			"records", n, "err", err)
		return
	}
	if now.Sub(h.logged) >= storeLogEvery {
		h.logged = now
		c.log.Warn("writeback: store still not writable; changed counters stay in memory",
			"unwritable_for", now.Sub(h.since).Round(time.Second), "failed_flushes", h.failures,
			"unflushed", c.Dirty(), "err", err)
	}
}

// StoreState returns what the flushes found of the store.
func (c *Cache) StoreState() StoreState {
	c.healthMu.Lock()
	defer c.healthMu.Unlock()
	if c.writable.Load() {
		return StoreState{Writable: true}
	}
	return StoreState{Since: c.health.since, Err: c.health.err, FailedFlushes: c.health.failures}
}

// requeue puts the entries of a failed flush back on their dirty lists.
func (c *Cache) requeue(items []flushItem) {
	var s *shard
	for _, it := range items {
		if it.s != s {
			if s != nil {
				s.mu.Unlock()
			}
			s = it.s
			s.mu.Lock()
		}
		if sl := it.sl; sl.has(dirtyBit) && !sl.has(queuedBit) {
			sl.set(queuedBit)
			s.push(sl)
		}
	}
	if s != nil {
		s.mu.Unlock()
	}
}

// Start starts the flush and expiry loops. They stop when ctx ends or at
// Close. Calling Start again does nothing.
func (c *Cache) Start(ctx context.Context) {
	c.life.Lock()
	defer c.life.Unlock()
	if c.cancel != nil || c.closed.Load() {
		return
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.loops.Add(2)
	go c.flushLoop(ctx)
	go c.expiryLoop(ctx)
}

// flushLoop flushes one FlushInterval after the first change since the
// previous flush (so a change waits at most one interval, and changes
// coming all the time are written once an interval as one batch), and at
// once when a shard's evicted entries waiting for their write reach its
// pendingMax, unless the store is unwritable: then the evicted entries
// wait in memory and the store is tried again at the interval, not at
// every eviction. It sleeps while nothing is dirty (Cache.dirtied wakes
// it); a failed flush is retried every interval, with or without new
// changes.
func (c *Cache) flushLoop(ctx context.Context) {
	defer c.loops.Done()
	t := time.NewTimer(c.cfg.FlushInterval)
	t.Stop()
	retry := false // the previous flush failed
	for {
		kicked := false
		if !retry {
			select {
			case <-ctx.Done():
				return
			case <-c.dirtied:
			case <-c.flushNow:
				kicked = c.writable.Load()
				if !kicked {
					continue
				}
			}
		}
		if !kicked {
			t.Reset(c.cfg.FlushInterval)
		wait:
			for {
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
					break wait
				case <-c.flushNow:
					if c.writable.Load() {
						t.Stop()
						break wait
					}
				}
			}
		}
		retry = c.Flush(ctx) != nil // logged and counted by Flush
	}
}

// expiryLoop runs the expiry passes; none while the store is unwritable
// (deleting writes too).
func (c *Cache) expiryLoop(ctx context.Context) {
	c.tick(ctx, c.cfg.ExpiryInterval, func() {
		if c.writable.Load() {
			c.expire(time.Now().UnixNano())
		}
	})
}

// tick calls fn every d until ctx ends; it runs on a loop goroutine.
func (c *Cache) tick(ctx context.Context, d time.Duration, fn func()) {
	defer c.loops.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// expire runs one bounded expiry pass over the store.
func (c *Cache) expire(now int64) {
	n, err := c.store.DeleteExpired(now, c.cfg.ExpiryBatch)
	c.expiredDeleted.Add(uint64(n))
	if err != nil {
		c.expiryErrors.Add(1)
		c.log.Error("writeback: expiry pass failed", "err", err)
	}
}

// Close stops the loops and waits for them, refuses further calls, flushes
// every dirty and pending entry and closes the store. When the final flush
// fails (or ctx ends first) the store is still closed and the error says
// that changes were lost.
func (c *Cache) Close(ctx context.Context) error {
	if !c.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	c.life.Lock()
	if c.cancel != nil {
		c.cancel()
	}
	c.life.Unlock()
	c.loops.Wait()
	for _, s := range c.shards {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
	}
	c.loadWG.Wait()
	select {
	case c.flushSem <- struct{}{}:
	case <-ctx.Done():
		// A flush is stuck; the store cannot be closed under it.
		return fmt.Errorf("writeback: close: %w", ctx.Err())
	}
	defer func() { <-c.flushSem }()
	ferr := c.flush(ctx)
	if ferr != nil {
		ferr = fmt.Errorf("writeback: close: final flush failed, the changes of %d counters are not on this node's disk: %w", c.Dirty(), ferr)
	}
	c.storeClosed = true
	return errors.Join(ferr, c.store.Close())
}
