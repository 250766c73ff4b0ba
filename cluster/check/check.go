package check

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// MaxBatchSize is the most checks one call carries (docs/architecture.md
// §5): a client's call or a forward between nodes of more is refused
// whole.
const MaxBatchSize = 1000

// Request is one check: Hits against the limit for (Name, Key). Hits 0 peeks.
// Limit.Limit 0 means "take the limit from the rules for Name".
type Request struct {
	Name string
	Key  string
	Hits int64
	bucket.Limit
	// More are further limits on (Name, Key), in order, decided atomically
	// with the embedded Limit (writeback's DecideAll): every limit admits and all
	// consume, or none does; the answer is bucket.Combine of their answers. When
	// the embedded Limit is all zero and More is non-empty, More alone is
	// the set (no rule is looked up); Validate refuses an embedded Limit
	// with Limit 0 but other fields set alongside a non-empty More, which
	// would be ambiguous. At most bucket.MaxLimitsPerRequest limits in all.
	More []bucket.Limit
	// Reset forgets the key's counts (bucket.Reset) instead of counting
	// Hits, which must be 0; the answer is that of a check of 0 hits after
	// it. Only Node.ResetKey sets it, and the forwards it makes: a
	// client's Check with Reset is refused.
	Reset bool
	// ReserveTTLMS, when above 0, reserves: Hits is an estimate, and an
	// admitted answer carries a reservation (Outcome.Reservation) to
	// settle within this many ms.
	ReserveTTLMS int64
	// ReservationID, when set, settles that reservation at Actual hits:
	// the difference to its estimate is charged or given back. Hits is 0.
	ReservationID string
	Actual        int64
	// Op, when set, is an operation on the key's concurrency limit
	// instead of a check: the embedded Limit's Limit is the most holders
	// and its WindowMS a lease's TTL; LeaseID names the lease to renew or
	// release. Hits is 0. Only Node.Hold sets it: a client's Check with
	// Op is refused.
	Op      LeaseOp
	LeaseID int64
}

// LeaseOp is an operation on a concurrency limit (docs/algorithms.md,
// "Concurrency limits"). The numbers are those of sluice.v1.LeaseOp.
type LeaseOp uint8

const (
	OpNone LeaseOp = iota
	OpAcquire
	OpRenew
	OpRelease
)

// Bounds of reserve, then settle.
const (
	// SettleRefusedPrefix starts the error of a settle its key's owner
	// refused (unknown or forged id, TTL passed, settled already): the
	// reservation counts at its estimate, and sending the settle again
	// changes nothing (the HTTP API answers it 409).
	SettleRefusedPrefix = "settle refused: "

	MaxReserveTTLMS     = 3_600_000 // an hour
	MaxReservationIDLen = 128
)

// Outcome is a Decision as it travels between nodes and back to the client:
// Owner names the node that decided; Err is set (with StatusUnspecified)
// when the request was invalid or could not be decided.
type Outcome struct {
	bucket.Decision
	Owner string
	Err   string
	// Lease, on an answer a key's owner sends the node that forwarded the
	// check, is a quota lease for that node (docs/leases.md); zero
	// otherwise, and never sent to clients.
	Lease Lease
	// Reservation is the id of the reservation an admitted check with
	// ReserveTTLMS made; Returned and Charged are what a settle gave back
	// and charged (Settled: the item was a settle that took place).
	Reservation       string
	Settled           bool
	Returned, Charged int64
	// LeaseID is, for an operation on a concurrency limit, the lease
	// acquired, renewed or released; 0 when none was (refused, or not
	// held).
	LeaseID int64
}

// Lease is a quota lease as it travels from a key's owner to the node that
// forwarded a check of it: Tokens more hits of the request's limit, which
// the owner has already admitted, for that node to admit itself, one check
// at a time, until TTL after it sent the check.
type Lease struct {
	Tokens int64
	TTL    time.Duration
	// GrantedAt is the grant's id: the owner's clock (Unix ns) when it
	// admitted the lease, which the holder names when it gives back
	// hits it did not spend. 0: the owner takes none back.
	GrantedAt int64
}

// LeaseReturn is the unspent part of a quota lease as its holder gives it
// back to the key's owner: Request names the key and the limit the lease
// was granted under, and Hits the hits given back; GrantedAt is the
// grant's id (Lease.GrantedAt).
type LeaseReturn struct {
	Request   Request
	GrantedAt int64
}

// RegionAsk is one key of a region's request to a global limit's home
// region (docs/regions.md): Request names the key and the global limit,
// and Hits the hits wanted (0: none); Return hits of the slice granted at
// ReturnGrantedAt are given back.
type RegionAsk struct {
	Request         Request
	Return          int64
	ReturnGrantedAt int64
}

// RegionQuery is one call of a region to a global limit's home region:
// From the asking node's name, Region its region, ToRegion the home
// region it asks; Routed when a node of the home region passed it on to
// the keys' owner.
type RegionQuery struct {
	From, Region, ToRegion string
	Routed                 bool
	Asks                   []RegionAsk
}

// RegionAnswer is the home region's answer to one RegionAsk: the slice it
// lends (Lease; TTL 0: none; Tokens 0 with a TTL: a refusal) and how many
// of the returned hits it took back.
type RegionAnswer struct {
	Lease Lease
	Taken int64
}

// Validate checks a request against docs/architecture.md §5. A request with Limit 0 is
// valid here (its limit comes from the rules); Validate checks the limit
// fields only when Limit is set. Every limit of More is checked too (an
// error names its index, "limits[2]: ..."), and there may be at most
// bucket.MaxLimitsPerRequest limits in all.
func (r *Request) Validate() error {
	if err := bucket.ValidateKey(r.Name, r.Key); err != nil {
		return err
	}
	if r.Hits < 0 {
		return fmt.Errorf("hits is %d, must be >= 0", r.Hits)
	}
	if r.Reset && r.Hits != 0 {
		return fmt.Errorf("a reset counts no hits: hits is %d, must be 0", r.Hits)
	}
	if err := r.validateReservation(); err != nil {
		return err
	}
	if err := r.validateOp(); err != nil {
		return err
	}
	if len(r.More) > 0 {
		return r.validateMore()
	}
	if r.Limit.Limit == 0 && r.WindowMS == 0 && r.Burst == 0 {
		if err := bucket.ValidateKinds(r.Algorithm, r.Mode, r.Calendar); err != nil {
			return err
		}
		if r.CalendarTZ != "" {
			_, err := bucket.LoadZone(r.CalendarTZ)
			return err
		}
		return nil
	}
	return r.Limit.Validate()
}

// validateReservation checks the reserve and settle fields.
func (r *Request) validateReservation() error {
	switch {
	case r.ReservationID == "" && r.Actual != 0:
		return fmt.Errorf("actual is set without reservation_id: a settle names its reservation")
	case r.ReserveTTLMS == 0 && r.ReservationID == "":
		return nil
	case r.ReserveTTLMS < 0 || r.ReserveTTLMS > MaxReserveTTLMS:
		return fmt.Errorf("reserve_ttl_ms is %d, must be 1..%d", r.ReserveTTLMS, MaxReserveTTLMS)
	case r.ReserveTTLMS > 0 && r.ReservationID != "":
		return fmt.Errorf("a check reserves (reserve_ttl_ms) or settles (reservation_id), not both")
	case r.ReserveTTLMS > 0 && r.Hits <= 0:
		return fmt.Errorf("a reservation needs hits, its estimate, above 0")
	case r.ReservationID != "" && r.Hits != 0:
		return fmt.Errorf("a settle counts no hits of its own: hits is %d, must be 0 (actual gives the cost)", r.Hits)
	case r.ReservationID != "" && (r.Actual < 0 || r.Actual > bucket.MaxLimit):
		return fmt.Errorf("actual is %d, must be 0..%d", r.Actual, bucket.MaxLimit)
	case len(r.ReservationID) > MaxReservationIDLen:
		return fmt.Errorf("reservation_id is %d bytes, more than %d", len(r.ReservationID), MaxReservationIDLen)
	case len(r.More) > 0:
		return fmt.Errorf("reserve and settle take one limit, not limits")
	case r.Reset:
		return fmt.Errorf("a reset neither reserves nor settles")
	}
	return nil
}

// validateOp checks the fields of an operation on a concurrency limit.
func (r *Request) validateOp() error {
	switch {
	case r.Op == OpNone:
		if r.LeaseID != 0 {
			return fmt.Errorf("lease_id is set without lease_op")
		}
		return nil
	case r.Op > OpRelease:
		return fmt.Errorf("unknown lease_op %d", r.Op)
	case r.Hits != 0 || r.Reset || r.ReserveTTLMS != 0 || r.ReservationID != "" || len(r.More) > 0:
		return fmt.Errorf("a lease operation counts no hits, and neither resets, reserves nor takes several limits")
	case r.Op == OpAcquire && r.LeaseID != 0:
		return fmt.Errorf("an acquire names no lease_id: the key's owner gives one")
	case r.Op != OpAcquire && r.LeaseID <= 0:
		return fmt.Errorf("lease_id is %d: renew and release name the lease acquired", r.LeaseID)
	case r.Op != OpRelease && (r.Limit.Limit < 1 || r.Limit.Limit > bucket.MaxHolders):
		return fmt.Errorf("limit is %d: a concurrency limit is 1..%d holders", r.Limit.Limit, bucket.MaxHolders)
	case r.Op != OpRelease && (r.WindowMS < 1 || r.WindowMS > bucket.MaxHoldTTLMS):
		return fmt.Errorf("ttl is %d ms: a lease lasts 1..%d ms", r.WindowMS, bucket.MaxHoldTTLMS)
	}
	return nil
}

// validateMore validates a request with a non-empty More.
func (r *Request) validateMore() error {
	n := len(r.More)
	inline := r.Limit != (bucket.Limit{})
	if inline {
		n++
	}
	if n > bucket.MaxLimitsPerRequest {
		return fmt.Errorf("more than %d limits in one request (the inline limit and limits together)", bucket.MaxLimitsPerRequest)
	}
	if inline {
		if r.Limit.Limit == 0 {
			return fmt.Errorf("the inline limit is 0 but its other fields are set, and limits is not empty: set the inline limit, or clear its fields to use limits alone")
		}
		if err := r.Limit.Validate(); err != nil {
			return err
		}
	}
	for i := range r.More {
		if err := r.More[i].Validate(); err != nil {
			return fmt.Errorf("limits[%d]: %w", i, err)
		}
		if r.More[i].Global && (len(r.More) > 1 || r.Limit.Limit != 0) {
			return fmt.Errorf("limits[%d]: a global limit must be the request's only limit", i)
		}
	}
	if r.Limit.Global && len(r.More) > 0 {
		return fmt.Errorf("a global limit must be the request's only limit")
	}
	return nil
}
