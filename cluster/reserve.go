package cluster

// Reserve, then settle (docs/algorithms.md): an admitted check of an
// estimate gets a reservation id, which the node that decided it signs
// with a key of its own; a settle within the reservation's TTL charges or
// gives back the difference to the actual cost, once. A node verifies only
// the ids it made, so a settle that reaches another node (the key's owner
// changed, or restarted) is refused and the reservation counts at its
// estimate: never more quota than was reserved comes back.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	"github.com/sluicehq/sluice/writeback"
)

// maxOpenSettles bounds the settled reservations a node remembers (until
// their TTL ends, to refuse a second settle); past it, settles are refused
// and the reservations count at their estimates.
const maxOpenSettles = 1 << 20

// reservationFormat is the first byte of a decoded reservation id.
const reservationFormat = 1

// idEncoding is how an id is written: strict, so that no two strings
// decode to one id.
var idEncoding = base64.RawURLEncoding.Strict()

// reservationLen is a decoded id: format, granted at, expiry and estimate,
// and a truncated HMAC-SHA256.
const reservationLen = 1 + 3*8 + 16

// reservations are the node's signing key and the settles it has done.
type reservations struct {
	key       [32]byte
	mu        sync.Mutex
	settled   map[string]int64 // decoded id → its expiry (Unix ns)
	lastPrune int64
}

func newReservations() *reservations {
	r := &reservations{settled: make(map[string]int64)}
	if _, err := rand.Read(r.key[:]); err != nil {
		panic(err) // crypto/rand never fails on the platforms Go supports
	}
	return r
}

// reservation is what an id says.
type reservation struct {
	grantedAt, expiry, estimate int64
}

// mac signs a reservation of (name, key) under lim.
func (rs *reservations) mac(name, key string, lim *bucket.Limit, res reservation) []byte {
	m := hmac.New(sha256.New, rs.key[:])
	fmt.Fprintf(m, "%s\x00%s\x00%d|%d|%d|%d|%d|%d|%d|%s\x00", name, key, lim.Algorithm, lim.Limit, lim.WindowMS, lim.Burst,
		lim.SubWindows, lim.Mode, lim.Calendar, lim.CalendarTZ)
	var b [24]byte
	binary.BigEndian.PutUint64(b[0:], uint64(res.grantedAt))
	binary.BigEndian.PutUint64(b[8:], uint64(res.expiry))
	binary.BigEndian.PutUint64(b[16:], uint64(res.estimate))
	m.Write(b[:])
	return m.Sum(nil)[:16]
}

// mint returns the id of a reservation of estimate hits of (name, key)
// under lim, admitted at now, to settle within ttlMS.
func (rs *reservations) mint(name, key string, lim *bucket.Limit, estimate, ttlMS, now int64) string {
	res := reservation{grantedAt: now, expiry: now + ttlMS*1e6, estimate: estimate}
	b := make([]byte, 0, reservationLen)
	b = append(b, reservationFormat)
	b = binary.BigEndian.AppendUint64(b, uint64(res.grantedAt))
	b = binary.BigEndian.AppendUint64(b, uint64(res.expiry))
	b = binary.BigEndian.AppendUint64(b, uint64(res.estimate))
	b = append(b, rs.mac(name, key, lim, res)...)
	return idEncoding.EncodeToString(b)
}

// Why a settle is refused; each leaves the reservation at its estimate.
var (
	errNotAReservation = errors.New(check.SettleRefusedPrefix + "reservation_id is not one this key's owner made (another node made it, the key's owner changed or restarted since, or the id or the limit differ from the reserving check's); the reservation counts at its estimate")
	errSettleExpired   = errors.New(check.SettleRefusedPrefix + "the reservation's reserve_ttl_ms has passed; it counts at its estimate")
	errSettledAlready  = errors.New(check.SettleRefusedPrefix + "the reservation was settled already")
	errTooManySettles  = fmt.Errorf(check.SettleRefusedPrefix+"this node remembers %d settled reservations, the most it keeps; the reservation counts at its estimate", maxOpenSettles)
)

// claim verifies id for (name, key) under lim at now and marks it
// settled; release undoes the mark when the settle could not be carried
// out.
func (rs *reservations) claim(name, key string, lim *bucket.Limit, id string, now int64) (reservation, error) {
	b, err := idEncoding.DecodeString(id)
	if err != nil || len(b) != reservationLen || b[0] != reservationFormat {
		return reservation{}, errNotAReservation
	}
	res := reservation{grantedAt: int64(binary.BigEndian.Uint64(b[1:])), expiry: int64(binary.BigEndian.Uint64(b[9:])),
		estimate: int64(binary.BigEndian.Uint64(b[17:]))}
	if !hmac.Equal(b[25:], rs.mac(name, key, lim, res)) {
		return reservation{}, errNotAReservation
	}
	if now > res.expiry {
		return reservation{}, errSettleExpired
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if now-rs.lastPrune > 1e9 {
		rs.lastPrune = now
		for k, exp := range rs.settled {
			if exp < now {
				delete(rs.settled, k)
			}
		}
	}
	if _, ok := rs.settled[string(b)]; ok {
		return reservation{}, errSettledAlready
	}
	if len(rs.settled) >= maxOpenSettles {
		return reservation{}, errTooManySettles
	}
	rs.settled[string(b)] = res.expiry
	return res, nil
}

func (rs *reservations) release(id string) {
	b, err := idEncoding.DecodeString(id)
	if err != nil {
		return
	}
	rs.mu.Lock()
	delete(rs.settled, string(b))
	rs.mu.Unlock()
}

// reservable reports why lim cannot be reserved against ("" when it can):
// a settle gives back only what bucket.Refund can.
func reservable(lims limits) string {
	l := lims.one
	switch {
	case len(lims.more) > 0:
		return "reserve and settle take one limit, not several"
	case l.Mode != bucket.ModeHard || l.CountRefused:
		return "reserve and settle need a hard limit that does not count refused hits"
	case l.Global:
		return "reserve and settle do not take a global limit"
	case l.Algorithm == bucket.TokenBucket, l.Algorithm == bucket.FixedWindow,
		(l.Algorithm == bucket.SlidingWindow || l.Algorithm == bucket.AlgorithmUnspecified) && l.SubWindows <= 1:
		return ""
	}
	return fmt.Sprintf("reserve and settle need token_bucket, fixed_window or sliding_window (without sub_windows), not %s", l.Algorithm)
}

// settleCache settles r's reservation in the cache: gives back what the
// estimate exceeded the actual cost by (bucket.Refund: as far as the
// algorithm can), or charges the excess (counted even where it is over
// the limit, saturating there), then answers r as a check of 0 hits. A
// refusal of the settle itself is an item error, not err.
func (n *Node) settleCache(h uint64, k writeback.Key, lims limits, r *check.Request, now int64, o *check.Outcome) error {
	lim := lims.one
	res, err := n.reserve.claim(r.Name, r.Key, lim, r.ReservationID, now)
	if err != nil {
		o.Err = err.Error()
		return nil
	}
	var returned, charged int64
	switch diff := r.Actual - res.estimate; {
	case diff < 0:
		back, err := n.cache.Refund(h, k, lim, -diff, res.grantedAt, now)
		if err != nil {
			n.reserve.release(r.ReservationID)
			return err
		}
		returned = back
	case diff > 0:
		var peek bucket.Decision
		if err := n.cache.DecideTo(&peek, h, k, lim, 0, now, n.Load()); err != nil {
			n.reserve.release(r.ReservationID)
			return err
		}
		charge := *lim
		charge.CountRefused = true
		var d bucket.Decision
		if err := n.cache.DecideTo(&d, h, k, &charge, diff, now, n.Load()); err != nil {
			n.reserve.release(r.ReservationID)
			return err
		}
		charged = diff
		if !d.Allowed() {
			charged = min(diff, max(peek.Remaining, 0))
		}
	}
	o.Settled, o.Returned, o.Charged = true, returned, charged
	if err := n.decideCache(&o.Decision, h, k, lims, 0, now); err != nil {
		// Settled, and the key released or unreadable the next moment:
		// stepping again would find the reservation settled.
		o.Decision = bucket.Decision{}
		o.Err = "settled, but the key's state could not be read after it: " + err.Error()
	}
	return nil
}
