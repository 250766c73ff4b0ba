package bucket

import (
	"testing"
	"unsafe"
)

func BenchmarkDecideSlidingWindow(b *testing.B) {
	b.Run("allow", func(b *testing.B) {
		b.ReportAllocs()
		lim := sw(MaxLimit, 1000)
		var s State
		now := t0
		for b.Loop() {
			now += 1000 // 1 µs apart: rolls over a window every million calls
			if !Decide(&s, lim, 1, now).Allowed() {
				b.Fatal("refused")
			}
		}
	})
	b.Run("deny", func(b *testing.B) {
		b.ReportAllocs()
		lim := sw(100, 1000)
		s := State{Algorithm: SlidingWindow, Start: t0, Count: 100, Expires: t0 + 2*sec}
		for b.Loop() {
			if Decide(&s, lim, 1, t0+500*ms).Allowed() {
				b.Fatal("admitted")
			}
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	b.ReportAllocs()
	s := State{Algorithm: SlidingWindow, Start: t0, Count: 3, Prev: 4, Expires: t0 + 2*sec}
	buf := make([]byte, 0, EncodedSize)
	for b.Loop() {
		buf, _ = s.AppendBinary(buf[:0])
	}
}

func BenchmarkDecode(b *testing.B) {
	b.ReportAllocs()
	in, _ := State{Algorithm: SlidingWindow, Start: t0, Count: 3, Prev: 4, Expires: t0 + 2*sec}.MarshalBinary()
	var s State
	for b.Loop() {
		if err := s.UnmarshalBinary(in); err != nil {
			b.Fatal(err)
		}
	}
}

// benchLimits are the limits BenchmarkDecide measures, one per algorithm.
var benchLimits = []struct {
	name string
	lim  Limit
}{
	{"sliding_window", Limit{Algorithm: SlidingWindow, Limit: 1000, WindowMS: 1000}},
	{"sub_window_60", Limit{Algorithm: SlidingWindow, Limit: 1000, WindowMS: 3_600_000, SubWindows: 60}},
	{"sliding_log_100", Limit{Algorithm: SlidingLog, Limit: 100, WindowMS: 1000}},
	{"sliding_log_10000", Limit{Algorithm: SlidingLog, Limit: MaxLogLimit, WindowMS: 1000}},
	{"token_bucket", Limit{Algorithm: TokenBucket, Limit: 1000, WindowMS: 1000, Burst: 100}},
	{"leaky_bucket", Limit{Algorithm: LeakyBucket, Limit: 1000, WindowMS: 1000, Burst: 100}},
	{"leaky_bucket_shaping", Limit{Algorithm: LeakyBucket, Limit: 1000, WindowMS: 1000, Burst: 100, Shaping: true}},
	{"fixed_window", Limit{Algorithm: FixedWindow, Limit: 1000, WindowMS: 1000}},
	{"fixed_window_month", Limit{Algorithm: FixedWindow, Limit: 1000, WindowMS: 1000, Calendar: CalendarMonth}},
	{"fixed_window_day_berlin", Limit{Algorithm: FixedWindow, Limit: 1000, WindowMS: 1000, Calendar: CalendarDay, CalendarTZ: "Europe/Berlin"}},
	{"gcra", Limit{Algorithm: GCRA, Limit: 1000, WindowMS: 1000, Burst: 100}},
	{"gcra_elastic", Limit{Algorithm: GCRA, Limit: 1000, WindowMS: 1000, Burst: 100, Mode: ModeElastic, ElasticCeiling: 2000, ElasticLoadPercent: 80}},
}

// BenchmarkDecide measures one decision per algorithm on a key offered
// about its limit's rate (1 hit every window/limit, about half of them
// refused for the log at its cap), and reports the key's size: in memory
// (State plus its Ext) and encoded.
//
//	go test ./bucket/ -run '^$' -bench BenchmarkDecide -benchtime 200000x
func BenchmarkDecide(b *testing.B) {
	for _, bl := range benchLimits {
		b.Run(bl.name, func(b *testing.B) {
			b.ReportAllocs()
			lim := bl.lim
			step := lim.WindowMS * ms / lim.Limit
			var s State
			now := t0
			// Fill the key first: the sliding log's size is its steady state.
			for range 2 * lim.Limit {
				now += step
				Decide(&s, lim, 1, now)
			}
			var allowed int
			b.ResetTimer()
			for b.Loop() {
				now += step
				if DecideLoad(&s, lim, 1, now, 0.5).Allowed() {
					allowed++
				}
			}
			ext := 0.0
			if s.Ext != nil {
				ext = float64(unsafe.Sizeof(*s.Ext)) + float64(8*s.Ext.Len())
			}
			b.ReportMetric(float64(unsafe.Sizeof(s))+ext, "B/key")
			b.ReportMetric(float64(s.EncodedLen()), "encoded-B/key")
		})
	}
}

func BenchmarkDecideAll(b *testing.B) {
	b.ReportAllocs()
	lims := []Limit{
		{Algorithm: SlidingWindow, Limit: 1 << 30, WindowMS: 3_600_000},
		{Algorithm: GCRA, Limit: 1 << 30, WindowMS: 60_000},
	}
	states := []*State{new(State), new(State)}
	out := make([]Decision, 2)
	now := t0
	for b.Loop() {
		now += 1000
		if !DecideAll(states, lims, 1, now, out) {
			b.Fatal("refused")
		}
	}
}
