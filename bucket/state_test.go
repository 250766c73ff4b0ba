package bucket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func randomValidState(rng *rand.Rand) State {
	return State{
		Algorithm: Algorithm(rng.IntN(int(GCRA) + 1)),
		Start:     rng.Int64N(math.MaxInt64),
		Count:     rng.Int64N(MaxLimit + 1),
		Prev:      rng.Int64N(MaxLimit + 1),
		Expires:   rng.Int64N(math.MaxInt64),
	}
}

func TestStateRoundTrip(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(9, 10))
	edges := []State{{}, {Algorithm: GCRA, Start: math.MaxInt64, Count: MaxLimit, Prev: MaxLimit, Expires: math.MaxInt64}}
	for i := range 10000 {
		s := randomValidState(rng)
		if i < len(edges) {
			s = edges[i]
		}
		b, err := s.MarshalBinary()
		if err != nil || len(b) != EncodedSize {
			t.Fatalf("MarshalBinary(%+v) = %d bytes, %v", s, len(b), err)
		}
		prefix := []byte("prefix")
		b2, err := s.AppendBinary(prefix)
		if err != nil || !bytes.Equal(b2[:len(prefix)], []byte("prefix")) || !bytes.Equal(b2[len(prefix):], b) {
			t.Fatalf("AppendBinary does not append the encoding: %x vs %x", b2, b)
		}
		var back State
		if err := back.UnmarshalBinary(b); err != nil || back != s {
			t.Fatalf("round trip of %+v: %+v, %v", s, back, err)
		}
	}
}

func TestStateDecodeRefuses(t *testing.T) {
	t.Parallel()
	good, _ := State{Algorithm: SlidingWindow, Start: t0, Count: 3, Prev: 4, Expires: t0 + 2*sec}.MarshalBinary()
	edit := func(f func(b []byte)) []byte {
		b := bytes.Clone(good)
		f(b)
		return b
	}
	put := func(off int, v int64) func(b []byte) {
		return func(b []byte) { binary.BigEndian.PutUint64(b[off:], uint64(v)) }
	}
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"empty", nil, "0 bytes, want 34"},
		{"one short", good[:EncodedSize-1], "33 bytes, want 34"},
		{"one long", append(bytes.Clone(good), 0), "35 bytes, want 34"},
		{"version 0", edit(func(b []byte) { b[0] = 0 }), "encoding version 0, want 1"},
		{"version 2 without its count", edit(func(b []byte) { b[0] = 2 }), "34 bytes, want at least 38 for encoding version 2"},
		{"version 3", edit(func(b []byte) { b[0] = 3 }), "encoding version 3, want 1 or 2"},
		{"unknown algorithm", edit(func(b []byte) { b[1] = 7 }), "unknown algorithm 7"},
		{"negative start", edit(put(2, -1)), "negative time"},
		{"negative count", edit(put(10, -1)), "count -1 out of range"},
		{"count over 2^40", edit(put(10, MaxLimit+1)), "count 1099511627777 out of range"},
		{"negative previous count", edit(put(18, -5)), "previous count -5 out of range"},
		{"previous count over 2^40", edit(put(18, math.MaxInt64)), "previous count 9223372036854775807 out of range"},
		{"negative expiry", edit(put(26, math.MinInt64)), "negative time"},
	}
	sentinel := State{Algorithm: SlidingWindow, Start: 1, Count: 2, Prev: 3, Expires: 4}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := sentinel
			err := s.UnmarshalBinary(tc.in)
			if !errors.Is(err, ErrBadState) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("UnmarshalBinary = %v, want ErrBadState saying %q", err, tc.want)
			}
			if s != sentinel {
				t.Fatalf("refused input changed the target: %+v", s)
			}
		})
	}
}

// FuzzStateDecode: decoding never panics; anything accepted is a state
// Decide can take and re-encodes to the same bytes.
func FuzzStateDecode(f *testing.F) {
	for _, s := range []State{{}, {Algorithm: SlidingWindow, Start: t0, Count: 3, Prev: 4, Expires: t0 + 2*sec}, {Algorithm: GCRA, Start: math.MaxInt64, Count: MaxLimit, Prev: MaxLimit, Expires: math.MaxInt64}} {
		b, _ := s.MarshalBinary()
		f.Add(b)
	}
	for _, alg := range []Algorithm{SlidingLog, SlidingWindow} {
		s := State{Algorithm: alg, Start: t0, Count: 1000, Prev: 10, Expires: t0 + sec, Ext: &Ext{vals: []int64{t0, t0, t0 + 5}}}
		b, _ := s.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{2})
	f.Add(bytes.Repeat([]byte{0xff}, EncodedSize))
	f.Fuzz(func(t *testing.T, in []byte) {
		var s State
		if err := s.UnmarshalBinary(in); err != nil {
			if !errors.Is(err, ErrBadState) {
				t.Fatalf("error %v does not wrap ErrBadState", err)
			}
			if s != (State{}) {
				t.Fatalf("refused input changed the target: %+v", s)
			}
			return
		}
		if s.EncodedLen() != len(in) {
			t.Fatalf("EncodedLen %d for %d bytes", s.EncodedLen(), len(in))
		}
		out, err := s.MarshalBinary()
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("re-encoding %+v: %x, %v; want %x", s, out, err, in)
		}
		d := Decide(&s, sw(MaxLimit, 1000), 1, t0)
		if d.Remaining < 0 || s.Count > MaxLimit {
			t.Fatalf("decoded state %+v gives %+v", s, d)
		}
	})
}

// FuzzDecide feeds arbitrary limits of every algorithm and mode, hits,
// times, loads and decodable states (sub-window counts or log timestamps
// included) through Validate and Decide and checks the invariants that
// hold for any input: no panic, remaining in [0, capacity], retry 0 iff
// allowed (save shaping delays), refusals and peeks change nothing unless
// refused hits count, the state stays decodable, and the same request
// passes after RetryAfterMS.
// Long on purpose: the seed corpus, then each invariant checked in turn on one input.
func FuzzDecide(f *testing.F) {
	f.Add(int64(10), int64(1000), int64(1), t0, uint8(1), t0, int64(3), int64(4), t0+2*sec, uint8(1), int64(0), uint8(0), int64(0), 0.5, []byte(nil))
	f.Add(MaxLimit, MaxWindowMS, int64(math.MaxInt64), int64(math.MaxInt64), uint8(1), int64(math.MaxInt64), MaxLimit, MaxLimit, int64(math.MaxInt64), uint8(1), int64(0), uint8(0), int64(0), 0.0, []byte(nil))
	f.Add(int64(0), int64(1), int64(0), int64(0), uint8(0), int64(0), int64(0), int64(0), int64(0), uint8(0), int64(0), uint8(0), int64(0), 0.0, []byte(nil))
	f.Add(int64(5), int64(1), int64(5), t0, uint8(3), t0+5*sec, int64(5), int64(5), int64(0), uint8(3), int64(7), uint8(4), int64(0), 0.0, []byte(nil))
	for alg := range uint8(7) {
		f.Add(int64(7), int64(60_000), int64(2), t0, alg, t0, int64(3), int64(4), t0+sec, alg, int64(9), alg*37, int64(alg)*13, 0.3, []byte{0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 9})
		f.Add(MaxLimit, MaxWindowMS, int64(math.MaxInt64), int64(math.MaxInt64)-1, alg, int64(math.MaxInt64), MaxLimit, MaxLimit, int64(math.MaxInt64), alg, MaxLimit, uint8(0xff), int64(math.MaxInt64), math.NaN(), []byte(nil))
	}
	f.Fuzz(func(t *testing.T, limit, window, hits, now int64, alg uint8, start, count, prev, expires int64, limAlg uint8, burst int64, opts uint8, extra int64, load float64, ext []byte) {
		lim := Limit{Algorithm: Algorithm(limAlg), Limit: limit, WindowMS: window, Burst: burst, CountRefused: opts&4 != 0}
		lim.Mode = Mode(opts & 3)
		switch lim.Mode {
		case ModeSoft:
			lim.SoftPercent = extra
		case ModeElastic:
			lim.ElasticCeiling, lim.ElasticLoadPercent = extra, 1+int64(opts>>5)*14
		default:
			if lim.Algorithm == SlidingWindow && extra > 0 {
				lim.SubWindows = extra % (MaxSubWindows + 1)
			}
		}
		if lim.Algorithm == LeakyBucket {
			lim.Shaping = opts&8 != 0
		}
		if lim.Algorithm == FixedWindow {
			lim.Calendar = Calendar(opts>>4) & 3
			if opts&8 != 0 {
				lim.CalendarTZ = "America/Havana" // changes at midnight
			}
		}
		// A check's hits are never negative (check.Request.Validate);
		// Decide needs the resolved limit, checked by Limit.Validate.
		if hits < 0 || lim.Validate() != nil || now < 0 {
			return
		}
		s := State{Algorithm: Algorithm(alg), Start: start, Count: count, Prev: prev, Expires: expires}
		if s.check() != nil {
			return
		}
		if len(ext) >= 8 {
			vals := make([]int64, len(ext)/8)
			for i := range vals {
				vals[i] = int64(binary.BigEndian.Uint64(ext[8*i:]))
			}
			if s.checkExt(vals) == nil {
				s.Ext = &Ext{vals: vals}
			}
		}
		capacity := limit
		switch lim.Algorithm {
		case TokenBucket, LeakyBucket, GCRA:
			if burst > 0 {
				capacity = burst
			}
		}
		before := s
		d := DecideLoad(&s, lim, hits, now, load)
		switch {
		case d.Limit != limit || d.Remaining < 0 || d.Remaining > capacity:
			t.Fatalf("decision %+v for %+v", d, lim)
		case d.Status != UnderLimit && d.Status != OverLimit:
			t.Fatalf("status %v", d.Status)
		case d.Allowed() != (d.RetryAfterMS == 0) && !lim.Shaping || d.RetryAfterMS < 0 || d.ResetAfterMS < 0:
			t.Fatalf("decision %+v: retry must be 0 exactly when allowed", d)
		case (!d.Allowed() && !lim.CountRefused || hits == 0) && s != before:
			t.Fatalf("refusal or peek changed %+v to %+v", before, s)
		case d.Allowed() && hits > 0 && (s.Expires < now || s.Fresh(now)):
			t.Fatalf("admitted into %+v", s)
		case s.check() != nil:
			t.Fatalf("Decide left an undecodable state %+v: %v", s, s.check())
		}
		if s.Ext != nil {
			if err := s.checkExt(s.Ext.vals); err != nil {
				t.Fatalf("Decide left an undecodable state %+v: %v", s, err)
			}
		}
		// A zero limit refuses everything, whatever the burst.
		if !d.Allowed() && max(hits, 1) <= capacity && limit > 0 {
			if at := now + d.RetryAfterMS*ms; d.RetryAfterMS < math.MaxInt64/ms && at >= now && at < math.MaxInt64-MaxWindowMS*ms {
				c := before
				if d2 := DecideLoad(&c, lim, hits, at, load); !d2.Allowed() {
					t.Fatalf("state %+v: not admitted after RetryAfter %d ms: %+v", before, d.RetryAfterMS, d2)
				}
			}
		}
	})
}

// Conflict: only a live state of another algorithm conflicts; an omitted
// algorithm is the sliding window; a state that never expires says so.
func TestConflict(t *testing.T) {
	t.Parallel()
	const now = int64(1_000_000_000_000)
	live := func(a Algorithm, expires int64) State { return State{Algorithm: a, Count: 1, Expires: expires} }
	for _, c := range []struct {
		s      State
		asked  Algorithm
		want   bool
		leftMS int64
	}{
		{live(SlidingWindow, now+1), SlidingWindow, false, 0},
		{live(SlidingWindow, now+1), AlgorithmUnspecified, false, 0},
		{live(SlidingWindow, now), TokenBucket, false, 0}, // expired at now: fresh
		{State{}, GCRA, false, 0},                         // never used
		{live(TokenBucket, now+1), AlgorithmUnspecified, true, 1},
		{live(FixedWindow, now+1500*1000*1000+1), LeakyBucket, true, 1501},
		{live(GCRA, math.MaxInt64), LeakyBucket, true, -1},
	} {
		err := Conflict(&c.s, &Limit{Algorithm: c.asked, Limit: 1, WindowMS: 1000}, now)
		var ce *AlgorithmConflict
		if got := errors.As(err, &ce); got != c.want {
			t.Errorf("state %+v, asked %v: conflict %v (%v), want %v", c.s, c.asked, got, err, c.want)
			continue
		}
		if c.want && (ce.ExpiresInMS != c.leftMS || ce.Stored != c.s.Algorithm) {
			t.Errorf("state %+v, asked %v: %+v, want stored %v, %d ms left", c.s, c.asked, *ce, c.s.Algorithm, c.leftMS)
		}
	}
}
