package bucket

import (
	"math"
	"math/bits"
)

// u128 is an unsigned 128-bit integer, for products of a time (< 2^63 ns)
// and a count (≤ 2^40) or a window (< 2^55 ns).
type u128 struct{ hi, lo uint64 }

// mul128 returns a × b for a, b ≥ 0.
func mul128(a, b int64) u128 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	return u128{hi, lo}
}

// add returns x + c for c ≥ 0 (no overflow for the products used here).
func (x u128) add(c int64) u128 {
	lo, carry := bits.Add64(x.lo, uint64(c), 0)
	return u128{x.hi + carry, lo}
}

// sub returns x − c for 0 ≤ c ≤ x.
func (x u128) sub(c int64) u128 {
	lo, borrow := bits.Sub64(x.lo, uint64(c), 0)
	return u128{x.hi - borrow, lo}
}

// div returns floor(x / d) and x mod d for d > 0; ok is false, with q =
// MaxInt64, when the quotient exceeds MaxInt64.
func (x u128) div(d int64) (q, r int64, ok bool) {
	if x.hi >= uint64(d) {
		return math.MaxInt64, 0, false
	}
	uq, ur := bits.Div64(x.hi, x.lo, uint64(d))
	if uq > math.MaxInt64 {
		return math.MaxInt64, 0, false
	}
	return int64(uq), int64(ur), true
}

// divCeil returns ceil(x / d) for d > 0, saturated at MaxInt64.
func (x u128) divCeil(d int64) int64 {
	q, r, ok := x.div(d)
	if ok && r != 0 {
		q = addSat(q, 1)
	}
	return q
}

// mulDiv returns floor(a × b / d) and the remainder, for a, b ≥ 0 and
// d > 0; ok is false, with q = MaxInt64, when the quotient exceeds
// MaxInt64.
func mulDiv(a, b, d int64) (q, r int64, ok bool) {
	return mul128(a, b).div(d)
}

// add128 returns x + y (no overflow for the sums used here).
func (x u128) add128(y u128) u128 {
	lo, carry := bits.Add64(x.lo, y.lo, 0)
	return u128{x.hi + y.hi + carry, lo}
}

// cmp returns −1, 0 or +1 as x is less than, equal to or greater than y.
func (x u128) cmp(y u128) int {
	switch {
	case x.hi != y.hi:
		if x.hi < y.hi {
			return -1
		}
		return 1
	case x.lo < y.lo:
		return -1
	case x.lo > y.lo:
		return 1
	}
	return 0
}
