package cluster

// Stand-in decisions the owner did not make: when the owner of a key gives
// up on a forwarded check because the sender's deadline has passed (a
// loaded machine: the forward waited in the owner's queue), the sender
// has failed the check over to the key's first replica, which decided it
// from its copy as a stand-in. The owner's next decision of the key would
// start from its own count, with a newer version than the stand-in's:
// its replication would then overwrite the replica's count, and the
// stand-in's hits would be lost. So the owner notes such keys, and before
// it decides one again it pulls the key from its first replica, without
// releasing it there, and installs the newer copy (as after a pull).

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/cluster/ownership"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// maxStoodIn bounds the keys standIns keeps; when full, those past their
// time are dropped, and everything when that frees less than a quarter.
const maxStoodIn = 1 << 16

// standInMemory is how long a key stays noted. A stand-in's decision
// stays on the replica until the owner decides the key again and
// replicates over it, however late that is; an hour covers the windows
// of most limits, whose counts matter no longer.
const standInMemory = time.Hour

// standIns holds the keys whose checks this node, their owner, gave up on
// (a forward past its sender's deadline) or failed over (errUnsettled),
// with the time (Unix ns) until which to pull a stand-in's decision
// (standInMemory). Safe for concurrent use; a decision of a key pays one atomic
// load while it holds none.
type standIns struct {
	size atomic.Int64 // len(keys)
	mu   sync.Mutex
	keys map[writeback.Key]int64
}

// note records k (copied) at now, until until.
func (s *standIns) note(k writeback.Key, now, until int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = make(map[writeback.Key]int64)
	}
	if len(s.keys) >= maxStoodIn {
		for key, u := range s.keys {
			if u < now {
				delete(s.keys, key)
			}
		}
		if len(s.keys) > maxStoodIn*3/4 {
			clear(s.keys)
		}
	}
	s.keys[writeback.Key{Name: k.Name, Key: k.Key}] = until
	s.size.Store(int64(len(s.keys)))
}

// take reports whether k is noted with a time at or after now, and forgets
// it either way.
func (s *standIns) take(k writeback.Key, now int64) bool {
	if s.size.Load() == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.keys[k]
	if ok {
		delete(s.keys, k)
		s.size.Store(int64(len(s.keys)))
	}
	return ok && until >= now
}

// noteGivenUp records that this node, k's owner, gave up on a forwarded
// check of k (every limit's key) at now.
func (n *Node) noteGivenUp(k writeback.Key, lims limits, now int64) {
	until := now + int64(standInMemory)
	if len(lims.more) == 0 {
		n.stoodIn.note(k, now, until)
		return
	}
	for i := range 1 + len(lims.more) {
		n.stoodIn.note(writeback.SubKey(k, i), now, until)
	}
}

// pullStandIn, when this node gave up on a forwarded check of k since it
// last decided it, pulls k (every limit's key) from k's first replica
// other than this node, without releasing it there, and installs what it
// got: the replica may have decided the check as a stand-in. A failed
// pull is counted, and the decision goes on with what this node holds.
func (n *Node) pullStandIn(ctx context.Context, h uint64, k writeback.Key, lims limits, now int64) {
	var keys []writeback.Key
	if len(lims.more) == 0 {
		if !n.stoodIn.take(k, now) {
			return
		}
		keys = []writeback.Key{k}
	} else {
		for i := range 1 + len(lims.more) {
			if sk := writeback.SubKey(k, i); n.stoodIn.take(sk, now) {
				keys = append(keys, sk)
			}
		}
		if len(keys) == 0 {
			return
		}
	}
	var rep ring.Member
	for _, r := range n.ring.Table().Replicas(h, nil) {
		if r.Name != n.name {
			rep = r
			break
		}
	}
	if rep.Addr == "" {
		return
	}
	s := ownership.NewSettle(n.cfg.GRPCAddr, false)
	for _, sk := range keys {
		s.Add(h, sk, keymove.Holder{Addr: rep.Addr})
	}
	for i, got := range n.pullRounds(ctx, s) {
		_, sk := s.Key(i)
		if n.debug {
			n.log.Debug("pulled a stand-in's copy", "name", sk.Name, "key", sk.Key, "from", rep.Name, "count", got.State.Count, "version", got.Version)
		}
		if got.Version > 0 {
			n.adopt(h, writeback.Record{Key: sk, State: got.State, Version: got.Version}, now)
		}
	}
}
