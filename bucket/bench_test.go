package bucket

import "testing"

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

func BenchmarkValidate(b *testing.B) {
	b.ReportAllocs()
	r := Request{Name: "api.create_url", Key: "user:4242424242", Hits: 1, Limit: sw(100, 60_000)}
	for b.Loop() {
		if err := r.Validate(); err != nil {
			b.Fatal(err)
		}
	}
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
