package bucket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// State is the counter of one (name, key): a small value. Its meaning
// depends on Algorithm; all times are Unix nanoseconds. docs/algorithms.md
// gives the layout of each algorithm.
//
// For SlidingWindow: Start is the start of the current fixed window (a
// multiple of the window length since the epoch), Count the hits admitted in
// it and Prev the hits admitted in the window before.
//
// Expires is the time from which the state is equivalent to a fresh one; a
// store may delete the state after it. MaxInt64 means never (the state's
// horizon lies past the largest time an int64 holds). The zero State is a
// fresh counter.
//
// Ext is nil except for the two algorithms whose state grows: the sliding
// log (its timestamps) and a sliding window with SubWindows ≥ 2 (its
// sub-window counts). An Ext is never modified once a State holds it —
// Decide replaces the pointer — so copies of a State may be kept and read
// without the lock that guards the original, and State stays comparable.
//
// Epoch counts the resets of the counter (Reset), modulo MaxEpoch+1:
// copies of different epochs are not merged (Merge), the newer version
// wins. Decide keeps it.
type State struct {
	Algorithm Algorithm
	Epoch     uint8
	Start     int64
	Count     int64
	Prev      int64
	Expires   int64
	Ext       *Ext
}

// Ext is the variable-size part of a State. It is immutable and opaque:
// only Decide and UnmarshalBinary make one.
type Ext struct {
	// vals is, for the sliding log, one admission time per hit in
	// ascending order; for the sub-window counter, the count of each
	// sub-window, oldest first, the last one for the sub-window that
	// starts at State.Start. Never empty.
	vals []int64
}

// Len returns the number of values the Ext holds (timestamps or
// sub-window counts); 0 for nil.
func (e *Ext) Len() int {
	if e == nil {
		return 0
	}
	return len(e.vals)
}

// Fresh reports whether s is, at now, equivalent to a counter that never saw
// a hit.
func (s *State) Fresh(now int64) bool { return FreshAt(s.Expires, now) }

// FreshAt reports whether a state whose Expires is expires is fresh at
// now: State.Fresh for holders that keep Expires apart from a State.
func FreshAt(expires, now int64) bool {
	return expires <= now && expires != math.MaxInt64
}

// Decide applies a request of hits against lim to s at time now (Unix
// nanoseconds), updates s when hits are admitted and returns the decision.
// Refused hits change nothing unless lim.CountRefused; hits 0 peeks: it
// changes nothing and reports OverLimit when no hit is left. lim must have
// passed Limit.Validate: a check.Request whose limit is all zero (take it from the
// rules) must be resolved first. Decide never panics or overflows on valid
// input, for any now ≥ 0 and any state UnmarshalBinary accepts. It
// allocates nothing, except for the sliding log and the sub-window counter,
// which allocate a new Ext on each admission.
//
// Decide knows no load: an elastic limit gets no headroom (see DecideLoad).
func Decide(s *State, lim Limit, hits, now int64) Decision {
	return DecideLoad(s, lim, hits, now, 1)
}

// DecideLoad is Decide for a node whose load is load: the fraction of its
// CPU capacity the sluice process used over the last second, that is
// process CPU time in that second ÷ (1 s × GOMAXPROCS), 0 idle, 1 saturated.
// Only ModeElastic limits look at it: they admit up to ElasticCeiling while
// load × 100 < ElasticLoadPercent. Values outside [0, 1] are allowed; NaN
// counts as overloaded.
func DecideLoad(s *State, lim Limit, hits, now int64, load float64) Decision {
	return DecideWith(s, &lim, hits, now, load)
}

// DecideWith is DecideLoad with the limit passed by pointer (see DecideTo).
func DecideWith(s *State, lim *Limit, hits, now int64, load float64) Decision {
	var d Decision
	DecideTo(&d, s, lim, hits, now, load)
	return d
}

// DecideTo is DecideLoad for the path of every check: the limit comes by
// pointer and the decision is written to *out, field by field. (A Limit is
// 88 bytes and a Decision 40; copying a struct whose fields were just
// written one by one stalls the processor's store forwarding, which cost
// this path half its time.) It does not keep lim.
func DecideTo(out *Decision, s *State, lim *Limit, hits, now int64, load float64) {
	// The algorithms write whole states; the epoch is not theirs.
	epoch := s.Epoch
	decideTo(out, s, lim, hits, now, load)
	s.Epoch = epoch
}

func decideTo(out *Decision, s *State, lim *Limit, hits, now int64, load float64) {
	if lim.WindowMS < MinWindowMS {
		// Not a valid limit: refuse rather than divide by zero.
		*out = Decision{Status: OverLimit, Limit: lim.Limit}
		return
	}
	now = max(now, 0)
	var p params
	effective(&p, lim, load)
	if p.limit == 0 && !(lim.Algorithm == SlidingWindow || lim.Algorithm == AlgorithmUnspecified) {
		// A zero limit refuses everything, for at least one window.
		*out = Decision{Status: OverLimit, Limit: lim.Limit, RetryAfterMS: lim.WindowMS}
		return
	}
	switch lim.Algorithm {
	case SlidingLog:
		*out = decideSlidingLog(s, &p, hits, now)
	case TokenBucket:
		*out = decideTokenBucket(s, &p, hits, now)
	case LeakyBucket:
		*out = decideTAT(s, LeakyBucket, &p, hits, now, lim.Shaping)
	case FixedWindow:
		*out = decideFixedWindow(s, &p, lim, hits, now)
	case GCRA:
		*out = decideTAT(s, GCRA, &p, hits, now, false)
	default:
		if lim.SubWindows > 1 {
			*out = decideSubWindow(s, &p, min(lim.SubWindows, MaxSubWindows), hits, now)
		} else {
			decideSlidingWindow(out, s, &p, hits, now)
		}
	}
	// Remaining counts against the real limit, not the soft or elastic one.
	out.Remaining = max(out.Remaining-p.headroom, 0)
	out.Limit = lim.Limit
	if out.Status != UnderLimit && out.RetryAfterMS <= 0 {
		// Only where waits saturate at the end of int64 time: never say
		// "retry now" to a refusal.
		out.RetryAfterMS = 1
	}
}

// params is a limit with its mode applied.
type params struct {
	limit    int64 // the limit in force
	burst    int64 // the bucket capacity in force, never 0 unless limit is
	w        int64 // window in ns
	headroom int64 // how much of limit (counters) or burst (buckets) is above the real one
	refused  bool  // CountRefused
}

func softLimit(n, percent int64) int64 {
	return min(n+n*percent/100, MaxLimit) // n ≤ 2^40, percent ≤ 1000: no overflow
}

// effective writes lim with its mode applied at load to p.
func effective(p *params, lim *Limit, load float64) {
	b := lim.Burst
	if b == 0 {
		b = lim.Limit
	}
	*p = params{limit: lim.Limit, burst: b, w: lim.WindowMS * nsPerMS, refused: lim.CountRefused}
	switch lim.Mode {
	case ModeSoft:
		p.limit, p.burst = softLimit(lim.Limit, lim.SoftPercent), softLimit(b, lim.SoftPercent)
	case ModeElastic:
		if load*100 < float64(lim.ElasticLoadPercent) && lim.ElasticCeiling > lim.Limit {
			p.limit = min(lim.ElasticCeiling, MaxLimit)
			switch {
			case lim.Burst == 0:
				p.burst = p.limit
			case lim.Limit > 0:
				q, _, _ := mulDiv(b, p.limit, lim.Limit)
				p.burst = min(q, MaxLimit)
			}
		}
	}
	switch lim.Algorithm {
	case TokenBucket, LeakyBucket, GCRA:
		p.headroom = p.burst - b
	default:
		p.headroom = p.limit - lim.Limit
	}
}

// DecideAll decides one request of hits against several limits of one key
// atomically, at load 1 (see DecideAllLoad).
func DecideAll(states []*State, lims []Limit, hits, now int64, out []Decision) bool {
	return DecideAllLoad(states, lims, hits, now, 1, out)
}

// DecideAllLoad decides one request of hits against several limits at
// once: states[i] counts lims[i]. Either every limit admits and all of
// them consume, or none consumes: it reports whether all admitted. It
// writes each limit's own answer to out[i]: when all admit, what Decide
// would have answered; when refused, the refusing limits' refusals and,
// for the others, UnderLimit with Remaining and ResetAfterMS as they stand
// (nothing consumed). Combine turns out into one answer. A limit with
// CountRefused that itself refuses records its refused hits; nothing else
// changes. The same *State may appear more than once (its limits then count
// on one counter, in order). len(states) must equal len(lims) and
// len(out) be at least that; it allocates nothing for up to 8 limits of
// fixed-size algorithms.
func DecideAllLoad(states []*State, lims []Limit, hits, now int64, load float64, out []Decision) bool {
	if len(states) != len(lims) || len(out) < len(lims) {
		panic(fmt.Sprintf("bucket.DecideAll: %d states, %d limits, %d decisions", len(states), len(lims), len(out)))
	}
	var buf [8]State
	var work []State
	if len(states) <= len(buf) {
		work = buf[:len(states)]
	} else {
		work = make([]State, len(states))
	}
	// first[i] is the index of the first occurrence of states[i].
	var fbuf [8]int
	var first []int
	if len(states) <= len(fbuf) {
		first = fbuf[:len(states)]
	} else {
		first = make([]int, len(states))
	}
	for i, s := range states {
		first[i] = i
		for j := range i {
			if states[j] == s {
				first[i] = j
				break
			}
		}
		if first[i] == i {
			work[i] = *s
		}
	}
	// Ext is immutable, so deciding on copies never touches the originals.
	all := true
	for i, lim := range lims {
		out[i] = DecideLoad(&work[first[i]], lim, hits, now, load)
		all = all && out[i].Allowed()
	}
	if all {
		for i, s := range states {
			if first[i] == i {
				*s = work[i]
			}
		}
		return true
	}
	for i, lim := range lims {
		if out[i].Allowed() {
			c := *states[i]
			pk := DecideLoad(&c, lim, 0, now, load)
			out[i] = Decision{Status: UnderLimit, Limit: pk.Limit, Remaining: pk.Remaining, ResetAfterMS: pk.ResetAfterMS}
		} else if lim.CountRefused {
			c := *states[i]
			if !DecideLoad(&c, lim, hits, now, load).Allowed() {
				*states[i] = c
			}
		}
	}
	return false
}

// Combine returns one answer for the per-limit answers of DecideAll: over
// the limit when any limit is; Limit and Remaining of the limit with the
// least remaining (the smaller limit on a tie); the longest ResetAfterMS;
// and the longest RetryAfterMS, which is when every limit admits the same
// request again if nothing else arrives. An empty ds gives the zero
// Decision.
func Combine(ds []Decision) Decision {
	if len(ds) == 0 {
		return Decision{}
	}
	c := ds[0]
	for _, d := range ds[1:] {
		if d.Status != UnderLimit {
			c.Status = d.Status
		}
		if d.Remaining < c.Remaining || (d.Remaining == c.Remaining && d.Limit < c.Limit) {
			c.Remaining, c.Limit = d.Remaining, d.Limit
		}
		c.ResetAfterMS = max(c.ResetAfterMS, d.ResetAfterMS)
		c.RetryAfterMS = max(c.RetryAfterMS, d.RetryAfterMS)
	}
	return c
}

// EncodedSize is the length of an encoded State without Ext (encoding
// version 1): every state of a fixed-size algorithm.
const EncodedSize = 2 + 4*8

// The second byte of an encoded State holds the Algorithm in its low four
// bits and the Epoch in its high four: a state that was never reset
// encodes as before epochs existed.
const (
	algorithmMask = 0x0f
	epochShift    = 4
)

// Encoding versions, the first byte of an encoded State.
const (
	encodingVersion    = 1 // fixed size: EncodedSize bytes
	encodingVersionExt = 2 // EncodedSize bytes as version 1, a big-endian uint32 n, n big-endian int64
)

// extHeaderSize is the length of a version-2 encoding with no values.
const extHeaderSize = EncodedSize + 4

// EncodedLen returns the length of the encoding of s: EncodedSize when
// s.Ext is nil.
func (s State) EncodedLen() int {
	if s.Ext == nil {
		return EncodedSize
	}
	return extHeaderSize + 8*len(s.Ext.vals)
}

// AppendBinary appends the versioned binary encoding of s to b: version
// 1 when s.Ext is nil, else version 2.
func (s State) AppendBinary(b []byte) ([]byte, error) {
	v := byte(encodingVersion)
	if s.Ext != nil {
		v = encodingVersionExt
	}
	b = append(b, v, byte(s.Algorithm)|s.Epoch<<epochShift)
	b = binary.BigEndian.AppendUint64(b, uint64(s.Start))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Count))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Prev))
	b = binary.BigEndian.AppendUint64(b, uint64(s.Expires))
	if s.Ext != nil {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s.Ext.vals)))
		for _, x := range s.Ext.vals {
			b = binary.BigEndian.AppendUint64(b, uint64(x))
		}
	}
	return b, nil
}

// MarshalBinary returns the versioned binary encoding of s.
func (s State) MarshalBinary() ([]byte, error) {
	return s.AppendBinary(make([]byte, 0, s.EncodedLen()))
}

// ErrBadState is wrapped by every decoding error.
var ErrBadState = errors.New("bad counter state")

// UnmarshalBinary decodes a State written by MarshalBinary. It refuses,
// without changing s, any input that is not exactly one valid encoding.
func (s *State) UnmarshalBinary(b []byte) error {
	if len(b) == 0 || (b[0] == encodingVersion && len(b) != EncodedSize) {
		return fmt.Errorf("%w: %d bytes, want %d", ErrBadState, len(b), EncodedSize)
	}
	switch b[0] {
	case encodingVersion:
	case encodingVersionExt:
		if len(b) < extHeaderSize {
			return fmt.Errorf("%w: %d bytes, want at least %d for encoding version 2", ErrBadState, len(b), extHeaderSize)
		}
		n := int64(binary.BigEndian.Uint32(b[EncodedSize:]))
		if want := int64(extHeaderSize) + 8*n; int64(len(b)) != want {
			return fmt.Errorf("%w: %d bytes, want %d for %d values", ErrBadState, len(b), want, n)
		}
	default:
		return fmt.Errorf("%w: encoding version %d, want 1 or 2", ErrBadState, b[0])
	}
	v := State{
		Algorithm: Algorithm(b[1] & algorithmMask),
		Epoch:     b[1] >> epochShift,
		Start:     int64(binary.BigEndian.Uint64(b[2:])),
		Count:     int64(binary.BigEndian.Uint64(b[10:])),
		Prev:      int64(binary.BigEndian.Uint64(b[18:])),
		Expires:   int64(binary.BigEndian.Uint64(b[26:])),
	}
	if err := v.check(); err != nil {
		return fmt.Errorf("%w: %v", ErrBadState, err)
	}
	if b[0] == encodingVersionExt {
		body := b[extHeaderSize:]
		vals := make([]int64, len(body)/8)
		for i := range vals {
			vals[i] = int64(binary.BigEndian.Uint64(body[8*i:]))
		}
		if err := v.checkExt(vals); err != nil {
			return fmt.Errorf("%w: %v", ErrBadState, err)
		}
		v.Ext = &Ext{vals: vals}
	}
	*s = v
	return nil
}

// check rejects states no algorithm can produce.
func (s *State) check() error {
	switch {
	case s.Algorithm > GCRA && s.Algorithm != Holders:
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

// checkExt rejects variable-size parts no algorithm can produce.
func (s *State) checkExt(vals []int64) error {
	switch s.Algorithm {
	case SlidingLog:
		if int64(len(vals)) > MaxLogLimit {
			return fmt.Errorf("sliding log of %d timestamps, more than %d", len(vals), MaxLogLimit)
		}
		for i, t := range vals {
			if t < 0 || (i > 0 && t < vals[i-1]) {
				return fmt.Errorf("sliding log timestamp %d at %d is negative or out of order", t, i)
			}
		}
	case SlidingWindow:
		if int64(len(vals)) > MaxSubWindows+1 {
			return fmt.Errorf("%d sub-window counts, more than %d", len(vals), MaxSubWindows+1)
		}
		if s.Prev < 2 || s.Prev > MaxSubWindows || s.Count < MinWindowMS || s.Count > MaxWindowMS {
			return fmt.Errorf("sub-window shape %d × %d ms out of range", s.Prev, s.Count)
		}
		for i, c := range vals {
			if c < 0 || c > MaxLimit {
				return fmt.Errorf("sub-window count %d at %d out of range", c, i)
			}
		}
	case Holders:
		if len(vals)%2 != 0 || int64(len(vals)) > 2*MaxHolders || s.Count != int64(len(vals)/2) {
			return fmt.Errorf("holders: %d values for %d holders", len(vals), s.Count)
		}
		for i := 0; i+1 < len(vals); i += 2 {
			if vals[i] <= 0 || (i > 0 && vals[i] <= vals[i-2]) || vals[i+1] < 0 || vals[i+1] > s.Expires {
				return fmt.Errorf("holder %d: lease id %d or expiry %d out of order or range", i/2, vals[i], vals[i+1])
			}
		}
	default:
		return fmt.Errorf("algorithm %s has no variable-size state", s.Algorithm)
	}
	if len(vals) == 0 {
		return fmt.Errorf("encoding version 2 with no values")
	}
	return nil
}

// AlgorithmConflict is the refusal of a check whose limit counts a key by
// another algorithm than the key's live state. Deciding it would start the
// count afresh and forget the hits the state holds, so the check is
// refused and nothing changes; once the state expires (ExpiresInMS), the
// key counts under whichever algorithm checks it next.
type AlgorithmConflict struct {
	Stored, Asked Algorithm
	ExpiresInMS   int64 // until the stored state is as good as fresh; -1: never
}

// AlgorithmConflictPrefix starts the message of every AlgorithmConflict,
// so that the item's error, which travels between nodes and to clients as
// text, still says what it is (the HTTP API answers it 409).
const AlgorithmConflictPrefix = "algorithm conflict: "

func (e *AlgorithmConflict) Error() string {
	left := fmt.Sprintf("for %d ms more", e.ExpiresInMS)
	if e.ExpiresInMS < 0 {
		left = "with no expiry"
	}
	return fmt.Sprintf(AlgorithmConflictPrefix+"the key is counted by %s %s and this check asks %s: "+
		"a key counts under one algorithm at a time (give the new limit another name, or check again once the count expires)",
		e.Stored, left, e.Asked)
}

// Conflict returns an *AlgorithmConflict when s holds, at now, a count of
// another algorithm than lim's (AlgorithmUnspecified is SlidingWindow),
// and nil otherwise: a state fresh at now holds nothing to forget.
func Conflict(s *State, lim *Limit, now int64) error {
	stored, asked := s.Algorithm, lim.Algorithm
	if stored == asked || stored == AlgorithmUnspecified || s.Fresh(now) {
		return nil
	}
	if asked == AlgorithmUnspecified {
		asked = SlidingWindow
	}
	if stored == asked {
		return nil
	}
	left := int64(-1)
	if s.Expires != math.MaxInt64 {
		left = ceilMS(s.Expires - max(now, 0))
	}
	return &AlgorithmConflict{Stored: stored, Asked: asked, ExpiresInMS: left}
}
