package bucket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func TestDecideAllAtomic(t *testing.T) {
	t.Parallel()
	// 10 per minute and 3 per second for one user.
	lims := []Limit{
		{Algorithm: SlidingWindow, Limit: 10, WindowMS: 60_000},
		{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000},
	}
	var minute, second State
	states := []*State{&minute, &second}
	out := make([]Decision, 2)
	for i := range 3 {
		if !DecideAll(states, lims, 1, t0+int64(i)*ms, out) {
			t.Fatalf("hit %d refused: %+v", i, out)
		}
	}
	m, s := minute, second
	if DecideAll(states, lims, 1, t0+3*ms, out) {
		t.Fatalf("4th hit in a second admitted: %+v", out)
	}
	if minute != m || second != s {
		t.Fatalf("a refused check consumed: %+v %+v", minute, second)
	}
	// The minute limit would have admitted: its standing, nothing consumed.
	if out[0].Status != UnderLimit || out[0].Remaining != 7 || out[0].RetryAfterMS != 0 {
		t.Fatalf("minute: %+v", out[0])
	}
	if out[1] != over(3, 0, 997, 997) {
		t.Fatalf("second: %+v", out[1])
	}
	c := Combine(out)
	if c != over(3, 0, out[0].ResetAfterMS, 997) {
		t.Fatalf("combined: %+v", c)
	}
	// The next second admits again and both consume.
	if !DecideAll(states, lims, 1, t0+sec, out) || minute.Count != 4 || second.Count != 1 {
		t.Fatalf("next second: %+v, %+v %+v", out, minute, second)
	}
	if c := Combine(out); c.Status != UnderLimit || c.Limit != 3 || c.Remaining != 2 {
		t.Fatalf("combined: %+v", c)
	}
}

func TestDecideAllVariableSize(t *testing.T) {
	t.Parallel()
	lims := []Limit{
		{Algorithm: SlidingLog, Limit: 5, WindowMS: 1000},
		{Algorithm: SlidingWindow, Limit: 100, WindowMS: 3_600_000, SubWindows: 60},
		{Algorithm: TokenBucket, Limit: 2, WindowMS: 1000},
	}
	var a, b, c State
	states := []*State{&a, &b, &c}
	out := make([]Decision, 3)
	if !DecideAll(states, lims, 2, t0, out) {
		t.Fatalf("%+v", out)
	}
	keep := []State{a, b, c}
	if DecideAll(states, lims, 1, t0+ms, out) {
		t.Fatalf("token bucket empty, admitted: %+v", out)
	}
	for i, s := range states {
		if !sameState(*s, keep[i]) || s.Ext != keep[i].Ext {
			t.Fatalf("limit %d changed on refusal: %+v → %+v", i, keep[i], *s)
		}
	}
	if a.Ext.Len() != 2 || b.Ext.Len() != 1 {
		t.Fatalf("ext %d %d", a.Ext.Len(), b.Ext.Len())
	}
}

func TestDecideAllSameStateTwice(t *testing.T) {
	t.Parallel()
	var s State
	lim := Limit{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000}
	out := make([]Decision, 2)
	// Two limits on one counter: both count, in order.
	if !DecideAll([]*State{&s, &s}, []Limit{lim, lim}, 1, t0, out) || s.Count != 2 || out[1].Remaining != 1 {
		t.Fatalf("%+v %+v", s, out)
	}
	if DecideAll([]*State{&s, &s}, []Limit{lim, lim}, 1, t0, out) || s.Count != 2 {
		t.Fatalf("second pair must be refused whole: %+v %+v", s, out)
	}
}

func TestDecideAllCountRefused(t *testing.T) {
	t.Parallel()
	counting := Limit{Algorithm: FixedWindow, Limit: 3, WindowMS: 1000, CountRefused: true}
	plain := Limit{Algorithm: FixedWindow, Limit: 100, WindowMS: 1000}
	var a, b State
	out := make([]Decision, 2)
	if DecideAll([]*State{&a, &b}, []Limit{counting, plain}, 5, t0, out) {
		t.Fatal("admitted 5 > 3")
	}
	if a.Count != 3 || b != (State{}) {
		t.Fatalf("the refusing limit counts its refused hits, the other nothing: %+v %+v", a, b)
	}
	// Refused because of the other limit: nothing counts anywhere.
	var c, d State
	small := Limit{Algorithm: FixedWindow, Limit: 1, WindowMS: 1000}
	counting.Limit = 100
	if DecideAll([]*State{&c, &d}, []Limit{counting, small}, 5, t0, out) || c != (State{}) || d != (State{}) {
		t.Fatalf("%+v %+v", c, d)
	}
}

// TestDecideAllProperty: on random traffic over random limits, either every
// state moves exactly as Decide alone would have moved it, or none moves.
func TestDecideAllProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 12))
	for range 200 {
		n := 1 + rng.IntN(4)
		lims := make([]Limit, n)
		states := make([]*State, n)
		for i := range n {
			lims[i] = randomAlgorithmLimit(rng, algorithmKinds[rng.IntN(len(algorithmKinds))])
			lims[i].Limit = 1 + rng.Int64N(20)
			lims[i].Burst = 0
			states[i] = new(State)
		}
		out := make([]Decision, n)
		now := t0
		for range 200 {
			hits := rng.Int64N(4)
			before := make([]State, n)
			for i, s := range states {
				before[i] = *s
			}
			all := DecideAll(states, lims, hits, now, out)
			alone := true
			for i := range n {
				c := before[i]
				d := Decide(&c, lims[i], hits, now)
				alone = alone && d.Allowed()
				if all && (!sameState(c, *states[i]) || d != out[i]) {
					t.Fatalf("admitted: limit %d moved to %+v, alone to %+v", i, *states[i], c)
				}
				if !all && (states[i] != nil && !sameState(before[i], *states[i])) {
					t.Fatalf("refused: limit %d moved", i)
				}
				if !all && d.Allowed() != out[i].Allowed() {
					t.Fatalf("refused: limit %d says %+v, alone %+v", i, out[i], d)
				}
			}
			if all != alone {
				t.Fatalf("DecideAll %v, every limit alone %v", all, alone)
			}
			now += rng.Int64N(lims[0].WindowMS * ms / 4)
		}
	}
}

func TestCombine(t *testing.T) {
	t.Parallel()
	if Combine(nil) != (Decision{}) {
		t.Fatal("empty")
	}
	ds := []Decision{under(100, 40, 900), over(10, 0, 300, 200), over(5, 0, 1000, 700)}
	if c := Combine(ds); c != over(5, 0, 1000, 700) {
		t.Fatalf("%+v", c)
	}
	if c := Combine(ds[:1]); c != ds[0] {
		t.Fatalf("%+v", c)
	}
}

// The token bucket, GCRA and the leaky meter make the same decisions.
func TestBucketsAgree(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(13, 14))
	for range 300 {
		lim := randomAlgorithmLimit(rng, "token_bucket")
		lim.CountRefused = rng.IntN(3) == 0
		if rng.IntN(3) == 0 {
			lim.Mode, lim.SoftPercent = ModeSoft, 1+rng.Int64N(200)
		}
		g, l := lim, lim
		g.Algorithm, l.Algorithm = GCRA, LeakyBucket
		var st, sg, sl State
		next := mixedTraffic(lim)
		now := t0 + rng.Int64N(sec)
		for i := range 300 {
			hits := randomHits(rng, lim.Limit)
			a, b, c := Decide(&st, lim, hits, now), Decide(&sg, g, hits, now), Decide(&sl, l, hits, now)
			if a != b || b != c {
				t.Fatalf("%+v request %d: token bucket %+v, gcra %+v, leaky %+v", lim, i, a, b, c)
			}
			now = next(rng, now)
		}
	}
}

func TestStateSize(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(State{}); n > 48 {
		t.Fatalf("State is %d bytes", n)
	}
	var a, b State
	_ = a == b // comparable
}

// Not parallel: AllocsPerRun counts the allocations of the whole process.
func TestFixedSizeAlgorithmsAllocateNothing(t *testing.T) {
	lims := []Limit{
		{Algorithm: SlidingWindow, Limit: 1000, WindowMS: 1000},
		{Algorithm: TokenBucket, Limit: 1000, WindowMS: 1000, Burst: 10},
		{Algorithm: LeakyBucket, Limit: 1000, WindowMS: 1000, Shaping: true},
		{Algorithm: FixedWindow, Limit: 1000, WindowMS: 1000},
		{Algorithm: FixedWindow, Limit: 1000, WindowMS: 1000, Calendar: CalendarMonth, CountRefused: true},
		{Algorithm: GCRA, Limit: 1000, WindowMS: 1000, Mode: ModeElastic, ElasticCeiling: 2000, ElasticLoadPercent: 50},
		{Algorithm: GCRA, Limit: 1000, WindowMS: 1000, Mode: ModeSoft, SoftPercent: 10},
	}
	for _, lim := range lims {
		var s State
		now := t0
		allocs := testing.AllocsPerRun(1000, func() {
			now += ms
			DecideLoad(&s, lim, 1, now, 0.2)
			Decide(&s, lim, 2000, now)
		})
		if allocs != 0 {
			t.Errorf("%v: Decide allocates %v times per call", lim.Algorithm, allocs)
		}
	}
	states := []*State{new(State), new(State)}
	out := make([]Decision, 2)
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now += ms
		DecideAll(states, lims[:2], 1, now, out)
	})
	if allocs != 0 {
		t.Errorf("DecideAll allocates %v times per call", allocs)
	}
}

// variableStates returns states of the sliding log and the sub-window
// counter made by real traffic.
func variableStates(t *testing.T) []State {
	var log, sub State
	for i := range int64(5) {
		Decide(&log, Limit{Algorithm: SlidingLog, Limit: 10, WindowMS: 1000}, 1+i%2, t0+i*100*ms)
		Decide(&sub, Limit{Algorithm: SlidingWindow, Limit: 100, WindowMS: 60_000, SubWindows: 6}, 3, t0+i*10*sec)
	}
	if log.Ext.Len() != 7 || sub.Ext.Len() != 5 {
		t.Fatalf("log %d, sub-windows %d", log.Ext.Len(), sub.Ext.Len())
	}
	return []State{log, sub}
}

func TestVariableStateEncoding(t *testing.T) {
	t.Parallel()
	for _, s := range variableStates(t) {
		b, err := s.MarshalBinary()
		if err != nil || len(b) != s.EncodedLen() || len(b) != extHeaderSize+8*s.Ext.Len() || b[0] != 2 {
			t.Fatalf("%+v: %d bytes, %v", s, len(b), err)
		}
		if err := roundTrip(s); err != nil {
			t.Fatal(err)
		}
	}
	// Fixed-size states keep version 1 and EncodedSize bytes.
	var gs State
	Decide(&gs, Limit{Algorithm: GCRA, Limit: 3, WindowMS: 1000}, 1, t0)
	if b, _ := gs.MarshalBinary(); len(b) != EncodedSize || b[0] != 1 || gs.EncodedLen() != EncodedSize {
		t.Fatalf("gcra state: %x", b)
	}
}

func TestVariableStateDecodeRefuses(t *testing.T) {
	t.Parallel()
	vs := variableStates(t)
	logB, _ := vs[0].MarshalBinary()
	subB, _ := vs[1].MarshalBinary()
	edit := func(good []byte, f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	putVal := func(i int, v int64) func([]byte) []byte {
		return func(b []byte) []byte { binary.BigEndian.PutUint64(b[extHeaderSize+8*i:], uint64(v)); return b }
	}
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"one value short", logB[:len(logB)-8], "want 94 for 7 values"},
		{"one byte long", append(bytes.Clone(logB), 0), "95 bytes, want 94 for 7 values"},
		{"no count", logB[:EncodedSize+2], "36 bytes, want at least 38 for encoding version 2"},
		{"huge count", edit(logB, func(b []byte) []byte { binary.BigEndian.PutUint32(b[EncodedSize:], math.MaxUint32); return b }), "want 34359738398 for 4294967295 values"},
		{"no values", edit(logB, func(b []byte) []byte { binary.BigEndian.PutUint32(b[EncodedSize:], 0); return b[:extHeaderSize] }), "encoding version 2 with no values"},
		{"log out of order", edit(logB, putVal(0, t0+sec)), "out of order"},
		{"negative timestamp", edit(logB, putVal(0, -1)), "timestamp -1 at 0 is negative"},
		{"gcra has no variable state", edit(logB, func(b []byte) []byte { b[1] = byte(GCRA); return b }), "algorithm gcra has no variable-size state"},
		{"unknown algorithm", edit(logB, func(b []byte) []byte { b[1] = 9; return b }), "unknown algorithm 9"},
		{"sub-window count negative", edit(subB, putVal(1, -3)), "sub-window count -3 at 1 out of range"},
		{"sub-window count over 2^40", edit(subB, putVal(0, MaxLimit+1)), "sub-window count 1099511627777 at 0 out of range"},
		{"one sub-window", edit(subB, func(b []byte) []byte { binary.BigEndian.PutUint64(b[18:], 1); return b }), "sub-window shape 1 × 60000 ms out of range"},
		{"sub-window window 0", edit(subB, func(b []byte) []byte { binary.BigEndian.PutUint64(b[10:], 0); return b }), "sub-window shape 6 × 0 ms out of range"},
		{"too many sub-windows", func() []byte {
			b := append(bytes.Clone(subB[:EncodedSize]), 0, 0, 0x03, 0xea) // 1002 values
			return append(b, make([]byte, 8*1002)...)
		}(), "1002 sub-window counts, more than 1001"},
		{"log over its cap", func() []byte {
			b := append(bytes.Clone(logB[:EncodedSize]), 0, 0, 0x27, 0x11) // 10001 values
			return append(b, make([]byte, 8*10001)...)
		}(), "sliding log of 10001 timestamps, more than 10000"},
	}
	sentinel := vs[0]
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

// Decide never writes to an Ext it was given: a copy taken before keeps
// its values.
func TestExtIsImmutable(t *testing.T) {
	t.Parallel()
	for _, s := range variableStates(t) {
		lim := Limit{Algorithm: s.Algorithm, Limit: 10, WindowMS: 1000}
		if s.Algorithm == SlidingWindow {
			lim = Limit{Algorithm: SlidingWindow, Limit: 100, WindowMS: 60_000, SubWindows: 6}
		}
		snap := s
		vals := append([]int64(nil), s.Ext.vals...)
		for i := range int64(50) {
			Decide(&s, lim, 1, t0+sec*i/3)
		}
		if snap.Ext == s.Ext || !slices.Equal(snap.Ext.vals, vals) {
			t.Fatalf("%v: Ext changed under a copy", s.Algorithm)
		}
	}
}
