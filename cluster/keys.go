package cluster

// Key administration (Admin/InspectKey, DrainKey, ResetKey): what a key's
// check would see, where the key lives, draining its quota and resetting
// it.

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/cluster/keymove"
	"github.com/sluicehq/sluice/ring"
	"github.com/sluicehq/sluice/writeback"
)

// KeyState is what InspectKey and DrainKey found of a key.
type KeyState struct {
	// Peek is the answer of a check of 0 hits, decided as any check is:
	// by the key's owner, or its replica when the owner does not answer.
	Peek check.Outcome
	// Owner and Replicas are the key's nodes in this node's ring.
	Owner    string
	Replicas []string
	// Versions holds the version of the owner's record of each of the
	// key's limits (0: none); nil when the owner did not answer.
	Versions []uint64
	// Drained is the hits DrainKey consumed.
	Drained int64
	// Limits are the limits in force for the key (an override, the
	// request's own, or the rule), as this node resolves them.
	Limits []bucket.Limit
}

// maxDrainRounds bounds DrainKey's rounds: each consumes what the peek
// before it saw remain; checks of other callers in between may leave some.
const maxDrainRounds = 4

// InspectKey reports what a check of r's key would see now, without
// counting anything (r.Hits is ignored), where the key lives, and the
// versions of its owner's records.
func (n *Node) InspectKey(ctx context.Context, r check.Request) (KeyState, error) {
	var ks KeyState
	if err := n.peek(ctx, r, &ks); err != nil {
		return ks, err
	}
	n.locate(ctx, r, &ks)
	return ks, nil
}

// DrainKey consumes what remains of r's key's quota (the most restrictive
// of its limits), as checks of that many hits decided by the key's owner,
// never from a lease this node holds, so that the key refuses until its
// window or bucket refills; it reports the key as InspectKey does after
// the drain. A key refusing already drains nothing; a soft or elastic
// limit keeps its headroom over the limit (Remaining counts against the
// limit itself).
func (n *Node) DrainKey(ctx context.Context, r check.Request) (KeyState, error) {
	var ks KeyState
	for range maxDrainRounds {
		if err := n.peek(ctx, r, &ks); err != nil {
			return ks, err
		}
		left := ks.Peek.Decision.Remaining
		if left <= 0 || !ks.Peek.Decision.Allowed() {
			break
		}
		d := r
		d.Hits = left
		out := []check.Outcome{{}}
		n.check(ctx, []check.Request{d}, out, true)
		if out[0].Err != "" {
			return ks, errors.New(out[0].Err)
		}
		if out[0].Decision.Allowed() {
			ks.Drained += left
		}
	}
	if err := n.peek(ctx, r, &ks); err != nil {
		return ks, err
	}
	n.locate(ctx, r, &ks)
	return ks, nil
}

// ResetKey forgets r's key's counts, all its limits', so that it has its
// full quota again (bucket.Reset), and reports the key as InspectKey does
// after the reset. The reset is decided as a check is, by the key's owner
// (or its replica standing in for it), never from a lease; it reaches the
// replicas and the store as a decision does, and no copy of the forgotten
// count merges back into it. Quota leases other nodes hold on the key
// stay theirs to spend (docs/operations.md).
func (n *Node) ResetKey(ctx context.Context, r check.Request) (KeyState, error) {
	var ks KeyState
	rr := r
	rr.Hits, rr.Reset = 0, true
	out := []check.Outcome{{}}
	n.check(ctx, []check.Request{rr}, out, true)
	if out[0].Err != "" {
		return ks, errors.New(out[0].Err)
	}
	ks.Peek = out[0]
	n.locate(ctx, r, &ks)
	return ks, nil
}

// peek decides a check of 0 hits of r's key into ks.Peek.
func (n *Node) peek(ctx context.Context, r check.Request, ks *KeyState) error {
	r.Hits = 0
	out := []check.Outcome{{}}
	n.check(ctx, []check.Request{r}, out, true)
	ks.Peek = out[0]
	if out[0].Err != "" {
		return errors.New(out[0].Err)
	}
	return nil
}

// locate fills ks's owner and replicas from this node's ring, and the
// versions of the owner's records of the key's limits (a pull that
// releases nothing; none when the owner does not answer).
func (n *Node) locate(ctx context.Context, r check.Request, ks *KeyState) {
	h := ring.Hash(r.Name, r.Key)
	reps := n.ring.Table().Replicas(h, nil)
	for i, m := range reps {
		if i == 0 {
			ks.Owner = m.Name
		} else {
			ks.Replicas = append(ks.Replicas, m.Name)
		}
	}
	var o check.Outcome
	lims, ok := n.prepare(&r, false, &o)
	if !ok || len(reps) == 0 {
		return
	}
	ks.Limits = lims.all()
	k := writeback.Key{Name: r.Name, Key: r.Key}
	keys := make([]bucket.Counter, 1+len(lims.more))
	for i := range keys {
		sk := k
		if len(keys) > 1 {
			sk = writeback.SubKey(k, i)
		}
		keys[i] = writeback.CounterOf(sk)
	}
	if reps[0].Name == n.name {
		now := n.now().UnixNano()
		for i := range keys {
			rec, _, err := n.cache.Get(h, writeback.KeyOf(keys[i]), now)
			if err != nil {
				return
			}
			ks.Versions = append(ks.Versions, rec.Version)
		}
		return
	}
	ans := make([]keymove.PullAnswer, len(keys))
	// One pull that releases nothing, bounded by the Admin call's own
	// deadline: an operator's call, not a check that must not outlast its
	// forward timeout.
	if err := n.peers.Pull(ctx, reps[0].Addr, keys, false, 0, ans); err != nil {
		n.log.Debug("inspect: the owner did not answer", "owner", reps[0].Name, "err", fmt.Sprint(err))
		return
	}
	for i := range keys {
		ks.Versions = append(ks.Versions, keys[i].Version)
	}
}
