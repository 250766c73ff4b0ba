package bucket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// State is the counter of one (name, key): a small fixed-size value. Its
// meaning depends on Algorithm; all times are Unix nanoseconds.
//
// For SlidingWindow: Start is the start of the current fixed window (a
// multiple of the window length since the epoch), Count the hits admitted in
// it and Prev the hits admitted in the window before.
//
// Expires is the time from which the state is equivalent to a fresh one; a
// store may delete the state after it. MaxInt64 means never (the state's
// horizon lies past the largest time an int64 holds). The zero State is a
// fresh counter.
type State struct {
	Algorithm Algorithm
	Start     int64
	Count     int64
	Prev      int64
	Expires   int64
}

// Fresh reports whether s is, at now, equivalent to a counter that never saw
// a hit.
func (s *State) Fresh(now int64) bool {
	return s.Expires <= now && s.Expires != math.MaxInt64
}

// Decide applies a request of hits against lim to s at time now (Unix
// nanoseconds), updates s when hits are admitted and returns the decision.
// Refused hits change nothing; hits 0 peeks: it changes nothing and reports
// OverLimit when no hit is left. lim must have passed Limit.Validate: a
// Request whose limit is all zero (take it from the rules) must be resolved
// first. Decide never panics or overflows on valid input, for any now ≥ 0
// and any state UnmarshalBinary accepts; it allocates nothing.
func Decide(s *State, lim Limit, hits, now int64) Decision {
	if lim.WindowMS < MinWindowMS {
		// Not a valid limit: refuse rather than divide by zero.
		return Decision{Status: OverLimit, Limit: lim.Limit}
	}
	// Limit.Validate refuses the algorithms that have no code yet, so every
	// valid limit reaches its own algorithm here.
	return decideSlidingWindow(s, lim, hits, now)
}

// EncodedSize is the length of an encoded State.
const EncodedSize = 2 + 4*8

// encodingVersion is the first byte of every encoded State.
const encodingVersion = 1

// AppendBinary appends the versioned binary encoding of s to b.
func (s State) AppendBinary(b []byte) ([]byte, error) {
	b = append(b, encodingVersion, byte(s.Algorithm))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Start))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Count))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Prev))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Expires))
	return b, nil
}

// MarshalBinary returns the versioned binary encoding of s.
func (s State) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, EncodedSize))
}

// ErrBadState is wrapped by every decoding error.
var ErrBadState = errors.New("bad counter state")

// UnmarshalBinary decodes a State written by MarshalBinary. It refuses,
// without changing s, any input that is not exactly one valid encoding.
func (s *State) UnmarshalBinary(b []byte) error {
	if len(b) != EncodedSize {
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadState, len(b), EncodedSize)
	}
	if b[0] != encodingVersion {
		return fmt.Errorf("%w: encoding version %d, want %d", ErrBadState, b[0], encodingVersion)
	}
	v := State{
		Algorithm: Algorithm(b[1]),
		Start:     int64(binary.BigEndian.Uint64(b[2:])),
		Count:     int64(binary.BigEndian.Uint64(b[10:])),
		Prev:      int64(binary.BigEndian.Uint64(b[18:])),
		Expires:   int64(binary.BigEndian.Uint64(b[26:])),
	}
	if err := v.check(); err != nil {
		return fmt.Errorf("%w: %v", ErrBadState, err)
	}
	*s = v
	return nil
}

// check rejects states no algorithm can produce.
func (s *State) check() error {
	switch {
	case s.Algorithm > GCRA:
		return fmt.Errorf("unknown algorithm %d", s.Algorithm)
	case s.Count < 0 || s.Count > MaxLimit:
		return fmt.Errorf("count %d out of range", s.Count)
	case s.Prev < 0 || s.Prev > MaxLimit:
		return fmt.Errorf("previous count %d out of range", s.Prev)
	case s.Start < 0 || s.Expires < 0:
		return fmt.Errorf("negative time")
	}
	return nil
}
