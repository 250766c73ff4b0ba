package cluster

// Carrying out a decision in this node's cache, for every path that decides
// from it (the owner, a stand-in, the owner-unavailable policy): which
// record a request is decided on, and what it asks of it.

import (
	"errors"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/writeback"
)

// recordKey is the cache key r is decided on: its key's holders record
// for an operation on a concurrency limit, else its key's counter (and
// its limits' sub-keys).
func recordKey(r *check.Request) writeback.Key {
	k := writeback.Key{Name: r.Name, Key: r.Key}
	if r.Op != check.OpNone {
		k = writeback.HoldersKey(k)
	}
	return k
}

// carryOut decides r on its record k (recordKey) in the cache, as the
// request asks: a lease operation, a settle, a reset, or a check of
// r.Hits; an admitted check that reserves gets its reservation. Every
// path that decides from the cache (the owner, a stand-in, the
// owner-unavailable policy) comes here.
func (n *Node) carryOut(h uint64, k writeback.Key, r *check.Request, lims limits, now int64, o *check.Outcome) error {
	var err error
	switch {
	case r.Op != check.OpNone:
		err = n.holdCache(h, k, lims.one, r, now, o)
	case r.ReservationID != "":
		err = n.settleCache(h, k, lims, r, now, o)
	case r.Reset:
		err = n.resetCache(h, k, lims, now)
		if err == nil {
			err = n.decideCache(&o.Decision, h, k, lims, 0, now)
		}
	default:
		err = n.decideCache(&o.Decision, h, k, lims, r.Hits, now)
	}
	if err == nil && r.ReserveTTLMS > 0 && o.Decision.Allowed() {
		o.Reservation = n.reserve.mint(r.Name, r.Key, lims.one, r.Hits, r.ReserveTTLMS, now)
	}
	return err
}

// decideCache applies hits to k's limits in the cache, with this node's
// load for elastic limits, and writes the decision to *d.
func (n *Node) decideCache(d *bucket.Decision, h uint64, k writeback.Key, lims limits, hits, now int64) error {
	if home, ok := n.away(h, lims); ok {
		return n.decideAway(d, h, k, lims.one, hits, now, home)
	}
	if len(lims.more) == 0 {
		return n.cache.DecideTo(d, h, k, lims.one, hits, now, n.Load())
	}
	all, err := n.cache.DecideAll(h, k, lims.all(), hits, now, n.Load())
	if err == nil {
		*d = all
	}
	return err
}

// resetCache forgets the counts of k's limits in the cache
// (writeback.Cache.Reset).
func (n *Node) resetCache(h uint64, k writeback.Key, lims limits, now int64) error {
	if _, ok := n.away(h, lims); ok {
		return errors.New("a key whose count another region holds (a global limit) is not reset from here: reset it in its home region")
	}
	if len(lims.more) == 0 {
		_, err := n.cache.Reset(h, k, now)
		return err
	}
	for i := range 1 + len(lims.more) {
		if _, err := n.cache.Reset(h, writeback.SubKey(k, i), now); err != nil {
			return err
		}
	}
	return nil
}
