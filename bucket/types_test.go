package bucket

import (
	"math"
	"strings"
	"testing"
)

// TestRequestValidate has one row per rule of DESIGN §5, on both sides of
// each bound. want is "" for a valid request, else a piece of the message,
// which must say what is wrong.
// One table of cases; long on purpose: each case reads alone.
func TestRequestValidate(t *testing.T) {
	t.Parallel()
	ok := Request{Name: "api.create_url", Key: "user:42", Hits: 1, Limit: sw(10, 60_000)}
	with := func(f func(r *Request)) Request {
		r := ok
		f(&r)
		return r
	}
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"valid", ok, ""},
		{"name empty", with(func(r *Request) { r.Name = "" }), "name is empty"},
		{"name 1 byte", with(func(r *Request) { r.Name = "a" }), ""},
		{"name 128 bytes", with(func(r *Request) { r.Name = strings.Repeat("n", 128) }), ""},
		{"name 129 bytes", with(func(r *Request) { r.Name = strings.Repeat("n", 129) }), "name is 129 bytes, more than 128"},
		{"name with NUL", with(func(r *Request) { r.Name = "api\x00x" }), "name contains a NUL byte at offset 3"},
		{"name not UTF-8", with(func(r *Request) { r.Name = "\xff\xfe" }), ""},
		{"key empty", with(func(r *Request) { r.Key = "" }), "key is empty"},
		{"key 1 byte", with(func(r *Request) { r.Key = "k" }), ""},
		{"key 1024 bytes", with(func(r *Request) { r.Key = strings.Repeat("k", 1024) }), ""},
		{"key 1025 bytes", with(func(r *Request) { r.Key = strings.Repeat("k", 1025) }), "key is 1025 bytes, more than 1024"},
		{"key with NUL and not UTF-8", with(func(r *Request) { r.Key = "\x00\xff" }), ""},
		{"hits negative", with(func(r *Request) { r.Hits = -1 }), "hits is -1, must be >= 0"},
		{"hits most negative", with(func(r *Request) { r.Hits = math.MinInt64 }), "hits is -9223372036854775808"},
		{"hits 0 (peek)", with(func(r *Request) { r.Hits = 0 }), ""},
		{"hits MaxInt64", with(func(r *Request) { r.Hits = math.MaxInt64 }), ""},
		{"limit negative", with(func(r *Request) { r.Limit.Limit = -1 }), "limit is -1, must be >= 0"},
		{"limit 0 with a window (explicit zero limit)", with(func(r *Request) { r.Limit.Limit = 0 }), ""},
		{"limit 2^40", with(func(r *Request) { r.Limit.Limit = MaxLimit }), ""},
		{"limit 2^40+1", with(func(r *Request) { r.Limit.Limit = MaxLimit + 1 }), "limit is 1099511627777, more than 2^40"},
		{"limit MaxInt64", with(func(r *Request) { r.Limit.Limit = math.MaxInt64 }), "more than 2^40"},
		{"window 0", with(func(r *Request) { r.WindowMS = 0 }), "window is 0 ms, must be at least 1 ms"},
		{"window negative", with(func(r *Request) { r.WindowMS = -5 }), "window is -5 ms, must be at least 1 ms"},
		{"window 1 ms", with(func(r *Request) { r.WindowMS = 1 }), ""},
		{"window 366 days", with(func(r *Request) { r.WindowMS = 366 * 24 * 3600 * 1000 }), ""},
		{"window 366 days + 1 ms", with(func(r *Request) { r.WindowMS = 366*24*3600*1000 + 1 }), "window is 31622400001 ms, more than 366 days"},
		{"window MaxInt64", with(func(r *Request) { r.WindowMS = math.MaxInt64 }), "more than 366 days"},
		{"burst negative", with(func(r *Request) { r.Burst = -1 }), "burst is -1, must be >= 0"},
		{"burst 0", with(func(r *Request) { r.Burst = 0 }), ""},
		{"burst 2^40", with(func(r *Request) { r.Burst = MaxLimit }), ""},
		{"burst 2^40+1", with(func(r *Request) { r.Burst = MaxLimit + 1 }), "burst is 1099511627777, more than 2^40"},
		{"algorithm unspecified", with(func(r *Request) { r.Algorithm = AlgorithmUnspecified }), ""},
		{"algorithm 7", with(func(r *Request) { r.Algorithm = 7 }), "unknown algorithm 7"},
		{"algorithm 255", with(func(r *Request) { r.Algorithm = 255 }), "unknown algorithm 255"},
		{"sliding_log", with(func(r *Request) { r.Algorithm = SlidingLog }), ""},
		{"token_bucket", with(func(r *Request) { r.Algorithm = TokenBucket; r.Burst = 5 }), ""},
		{"leaky_bucket", with(func(r *Request) { r.Algorithm = LeakyBucket }), ""},
		{"leaky_bucket shaping", with(func(r *Request) { r.Algorithm = LeakyBucket; r.Shaping = true }), ""},
		{"fixed_window", with(func(r *Request) { r.Algorithm = FixedWindow }), ""},
		{"gcra", with(func(r *Request) { r.Algorithm = GCRA }), ""},
		{"sliding_log at its cap", with(func(r *Request) { r.Algorithm = SlidingLog; r.Limit.Limit = MaxLogLimit }), ""},
		{"sliding_log over its cap", with(func(r *Request) { r.Algorithm = SlidingLog; r.Limit.Limit = MaxLogLimit + 1 }), "sliding_log keeps one timestamp per hit: a limit of 10001 (with its soft or elastic headroom) is more than its cap of 10000"},
		{"sliding_log soft headroom over its cap", with(func(r *Request) {
			r.Algorithm, r.Limit.Limit, r.Mode, r.SoftPercent = SlidingLog, 10_000, ModeSoft, 1
		}), "a limit of 10100"},
		{"sliding_log elastic ceiling over its cap", with(func(r *Request) {
			r.Algorithm, r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = SlidingLog, ModeElastic, 20_000, 50
		}), "a limit of 20000"},
		{"sub_windows 60", with(func(r *Request) { r.SubWindows = 60 }), ""},
		{"sub_windows 1000", with(func(r *Request) { r.SubWindows = MaxSubWindows }), ""},
		{"sub_windows 1001", with(func(r *Request) { r.SubWindows = 1001 }), "sub_windows is 1001, more than 1000"},
		{"sub_windows negative", with(func(r *Request) { r.SubWindows = -1 }), "sub_windows is -1, must be >= 0"},
		{"sub_windows on unspecified", with(func(r *Request) { r.Algorithm = AlgorithmUnspecified; r.SubWindows = 2 }), ""},
		{"sub_windows 1 on gcra", with(func(r *Request) { r.Algorithm = GCRA; r.SubWindows = 1 }), ""},
		{"sub_windows on gcra", with(func(r *Request) { r.Algorithm = GCRA; r.SubWindows = 2 }), "sub_windows applies only to sliding_window, not gcra"},
		{"shaping on gcra", with(func(r *Request) { r.Algorithm = GCRA; r.Shaping = true }), "shaping applies only to leaky_bucket, not gcra"},
		{"calendar day", with(func(r *Request) { r.Algorithm = FixedWindow; r.Calendar = CalendarDay }), ""},
		{"calendar month", with(func(r *Request) { r.Algorithm = FixedWindow; r.Calendar = CalendarMonth }), ""},
		{"calendar unknown", with(func(r *Request) { r.Algorithm = FixedWindow; r.Calendar = 4 }), "unknown calendar 4"},
		{"calendar on sliding_window", with(func(r *Request) { r.Calendar = CalendarWeek }), "calendar windows apply only to fixed_window, not sliding_window"},
		{"mode unknown", with(func(r *Request) { r.Mode = 3 }), "unknown mode 3"},
		{"soft 10%", with(func(r *Request) { r.Mode, r.SoftPercent = ModeSoft, 10 }), ""},
		{"soft 1000%", with(func(r *Request) { r.Mode, r.SoftPercent = ModeSoft, 1000 }), ""},
		{"soft 0%", with(func(r *Request) { r.Mode = ModeSoft }), "mode soft needs soft_percent in 1..1000, not 0"},
		{"soft 1001%", with(func(r *Request) { r.Mode, r.SoftPercent = ModeSoft, 1001 }), "mode soft needs soft_percent in 1..1000, not 1001"},
		{"soft_percent without mode soft", with(func(r *Request) { r.SoftPercent = 10 }), "soft_percent applies only to mode soft, not hard"},
		{"elastic", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = ModeElastic, 20, 70 }), ""},
		{"elastic ceiling 2^40", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = ModeElastic, MaxLimit, 100 }), ""},
		{"elastic ceiling at the limit", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = ModeElastic, 10, 70 }), "mode elastic needs elastic_ceiling above the limit 10 and at most 2^40, not 10"},
		{"elastic ceiling over 2^40", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = ModeElastic, MaxLimit+1, 70 }), "not 1099511627777"},
		{"elastic load 0%", with(func(r *Request) { r.Mode, r.ElasticCeiling = ModeElastic, 20 }), "mode elastic needs elastic_load_percent in 1..100, not 0"},
		{"elastic load 101%", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = ModeElastic, 20, 101 }), "not 101"},
		{"elastic fields without mode elastic", with(func(r *Request) { r.ElasticCeiling = 20 }), "elastic_ceiling and elastic_load_percent apply only to mode elastic, not hard"},
		{"elastic load without mode elastic", with(func(r *Request) { r.Mode, r.SoftPercent, r.ElasticLoadPercent = ModeSoft, 5, 50 }), "apply only to mode elastic, not soft"},
		{"count_refused", with(func(r *Request) { r.CountRefused = true }), ""},
		// Limit, window and burst all 0: the limit comes from the rules for Name.
		{"limit from rules", with(func(r *Request) { r.Limit = Limit{} }), ""},
		{"limit from rules, algorithm named", with(func(r *Request) { r.Limit = Limit{Algorithm: GCRA} }), ""},
		{"limit from rules, unknown algorithm", with(func(r *Request) { r.Limit = Limit{Algorithm: 9} }), "unknown algorithm 9"},
		{"limit from rules, bad key still refused", with(func(r *Request) { r.Limit = Limit{}; r.Key = "" }), "key is empty"},
		{"limit from rules, bad hits still refused", with(func(r *Request) { r.Limit = Limit{}; r.Hits = -2 }), "hits is -2"},
		{"window without a limit", with(func(r *Request) { r.Limit = Limit{WindowMS: 1000} }), ""},
		{"burst alone is checked", with(func(r *Request) { r.Limit = Limit{Burst: -1} }), "window is 0 ms"},
		{"limit from rules, unknown mode", with(func(r *Request) { r.Limit = Limit{Mode: 255} }), "unknown mode 255"},
		{"limit from rules, unknown calendar", with(func(r *Request) { r.Limit = Limit{Calendar: 255} }), "unknown calendar 255"},
		// More: further limits on the same key.
		{"more, one limit", with(func(r *Request) { r.More = []Limit{sw(500, 3_600_000)} }), ""},
		{"more, every option", with(func(r *Request) {
			r.More = []Limit{
				{Algorithm: SlidingWindow, Limit: 1000, WindowMS: 3_600_000, SubWindows: 60, CountRefused: true},
				{Algorithm: LeakyBucket, Limit: 5, WindowMS: 1000, Burst: 10, Shaping: true},
				{Algorithm: FixedWindow, Limit: 10_000, WindowMS: 1, Calendar: CalendarMonth, Mode: ModeSoft, SoftPercent: 10},
				{Algorithm: GCRA, Limit: 5, WindowMS: 1000, Mode: ModeElastic, ElasticCeiling: 8, ElasticLoadPercent: 70},
			}
		}), ""},
		{"more alone (inline all zero)", with(func(r *Request) { r.Limit = Limit{}; r.More = []Limit{sw(5, 1000), sw(20, 60_000)} }), ""},
		{"more alone, explicit zero limit in more", with(func(r *Request) { r.Limit = Limit{}; r.More = []Limit{sw(0, 1000)} }), ""},
		{"more alone, 16 limits", with(func(r *Request) { r.Limit = Limit{}; r.More = repeatLimit(sw(5, 1000), 16) }), ""},
		{"more alone, 17 limits", with(func(r *Request) { r.Limit = Limit{}; r.More = repeatLimit(sw(5, 1000), 17) }), "more than 16 limits in one request"},
		{"inline and 15 more", with(func(r *Request) { r.More = repeatLimit(sw(5, 1000), 15) }), ""},
		{"inline and 16 more", with(func(r *Request) { r.More = repeatLimit(sw(5, 1000), 16) }), "more than 16 limits in one request"},
		{"more, many limits", with(func(r *Request) { r.More = make([]Limit, 100_000) }), "more than 16 limits"},
		{"more, all-zero entry", with(func(r *Request) { r.More = []Limit{sw(5, 1000), sw(1, 1), {}} }), "limits[2]: window is 0 ms, must be at least 1 ms"},
		{"more, bad window", with(func(r *Request) { r.More = []Limit{sw(5, MaxWindowMS+1)} }), "limits[0]: window is 31622400001 ms, more than 366 days"},
		{"more, negative limit", with(func(r *Request) { r.More = []Limit{sw(5, 1000), sw(-1, 1000)} }), "limits[1]: limit is -1, must be >= 0"},
		{"more, limit over 2^40", with(func(r *Request) { r.More = []Limit{sw(MaxLimit+1, 1000)} }), "limits[0]: limit is 1099511627777, more than 2^40"},
		{"more, negative burst", with(func(r *Request) { r.More = []Limit{{Algorithm: TokenBucket, Limit: 5, WindowMS: 1000, Burst: -1}} }), "limits[0]: burst is -1"},
		{"more, unknown algorithm", with(func(r *Request) { r.More = []Limit{{Algorithm: 255, Limit: 5, WindowMS: 1000}} }), "limits[0]: unknown algorithm 255"},
		{"more, unknown mode", with(func(r *Request) { r.More = []Limit{{Mode: 255, Limit: 5, WindowMS: 1000}} }), "limits[0]: unknown mode 255"},
		{"more, unknown calendar", with(func(r *Request) { r.More = []Limit{{Algorithm: FixedWindow, Calendar: 255, Limit: 5, WindowMS: 1000}} }), "limits[0]: unknown calendar 255"},
		{"more, sub_windows on gcra", with(func(r *Request) { r.More = []Limit{{Algorithm: GCRA, Limit: 5, WindowMS: 1000, SubWindows: 2}} }), "limits[0]: sub_windows applies only to sliding_window, not gcra"},
		{"more, soft without percent", with(func(r *Request) { r.More = []Limit{{Limit: 5, WindowMS: 1000, Mode: ModeSoft}} }), "limits[0]: mode soft needs soft_percent"},
		{"more, elastic ceiling at the limit", with(func(r *Request) {
			r.More = []Limit{{Limit: 5, WindowMS: 1000, Mode: ModeElastic, ElasticCeiling: 5, ElasticLoadPercent: 50}}
		}), "limits[0]: mode elastic needs elastic_ceiling above the limit 5"},
		{"more, sliding_log over its cap", with(func(r *Request) { r.More = []Limit{{Algorithm: SlidingLog, Limit: MaxLogLimit + 1, WindowMS: 1000}} }), "limits[0]: sliding_log keeps one timestamp per hit"},
		{"more, bad inline still refused", with(func(r *Request) { r.WindowMS = 0; r.More = []Limit{sw(5, 1000)} }), "window is 0 ms"},
		{"more, inline explicit zero limit is ambiguous", with(func(r *Request) { r.Limit.Limit = 0; r.More = []Limit{sw(5, 1000)} }), "the inline limit is 0 but its other fields are set"},
		{"more, inline algorithm alone is ambiguous", with(func(r *Request) { r.Limit = Limit{Algorithm: GCRA}; r.More = []Limit{sw(5, 1000)} }), "the inline limit is 0 but its other fields are set"},
		{"more, bad key still refused", with(func(r *Request) { r.Key = ""; r.More = []Limit{sw(5, 1000)} }), "key is empty"},
		{"more, bad hits still refused", with(func(r *Request) { r.Hits = -1; r.More = []Limit{sw(5, 1000)} }), "hits is -1"},
		{"more empty but not nil", with(func(r *Request) { r.More = []Limit{} }), ""},
		{"more empty, limit from rules", with(func(r *Request) { r.Limit = Limit{}; r.More = []Limit{} }), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.req.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.want != "" && err == nil:
				t.Fatalf("Validate() = nil, want an error containing %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Validate() = %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func repeatLimit(l Limit, n int) []Limit {
	ls := make([]Limit, n)
	for i := range ls {
		ls[i] = l
	}
	return ls
}

func TestParseAlgorithm(t *testing.T) {
	t.Parallel()
	for a := SlidingWindow; a <= GCRA; a++ {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	for _, s := range []string{"", "unspecified", "SLIDING_WINDOW", "sliding-window", "algorithm(7)", "gcra "} {
		_, err := ParseAlgorithm(s)
		if err == nil || !strings.Contains(err.Error(), "unknown algorithm") || !strings.Contains(err.Error(), "sliding_window") {
			t.Errorf("ParseAlgorithm(%q) = %v, want an unknown-algorithm error listing the names", s, err)
		}
	}
	if s := Algorithm(7).String(); s != "algorithm(7)" {
		t.Errorf("Algorithm(7).String() = %q", s)
	}
}

func TestParseModeAndCalendar(t *testing.T) {
	t.Parallel()
	for m := ModeHard; m <= ModeElastic; m++ {
		if got, err := ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	for c := CalendarNone; c <= CalendarMonth; c++ {
		if got, err := ParseCalendar(c.String()); err != nil || got != c {
			t.Errorf("ParseCalendar(%q) = %v, %v", c.String(), got, err)
		}
	}
	if m, err := ParseMode(""); m != ModeHard || err != nil {
		t.Errorf("ParseMode(\"\") = %v, %v", m, err)
	}
	if c, err := ParseCalendar(""); c != CalendarNone || err != nil {
		t.Errorf("ParseCalendar(\"\") = %v, %v", c, err)
	}
	if _, err := ParseMode("Soft"); err == nil || !strings.Contains(err.Error(), "want hard, soft or elastic") {
		t.Errorf("ParseMode(Soft) = %v", err)
	}
	if _, err := ParseCalendar("year"); err == nil || !strings.Contains(err.Error(), "want day, week, month or none") {
		t.Errorf("ParseCalendar(year) = %v", err)
	}
	if Mode(9).String() != "mode(9)" || Calendar(9).String() != "calendar(9)" {
		t.Error("String of unknown values")
	}
}

// FuzzValidate: Validate never panics, and whatever it accepts is inside
// the bounds of DESIGN §5.
func FuzzValidate(f *testing.F) {
	f.Add("api", "user:1", int64(1), uint8(1), int64(10), int64(1000), int64(0))
	f.Add("", "", int64(-1), uint8(9), int64(-1), int64(0), int64(-1))
	f.Add("a\x00", "k", int64(0), uint8(0), int64(0), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, name, key string, hits int64, alg uint8, limit, window, burst int64) {
		r := Request{Name: name, Key: key, Hits: hits, Limit: Limit{Algorithm: Algorithm(alg), Limit: limit, WindowMS: window, Burst: burst}}
		err := r.Validate()
		// The same limit as the only one of More is accepted exactly when
		// the request's name, key and hits are and the limit itself is.
		m := Request{Name: name, Key: key, Hits: hits, More: []Limit{r.Limit}}
		if mErr, want := m.Validate(), ValidateKey(name, key) == nil && hits >= 0 && r.Limit.Validate() == nil; (mErr == nil) != want {
			t.Fatalf("Validate of %+v = %v, want accepted %v", m, mErr, want)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if len(name) < 1 || len(name) > MaxNameLen || strings.IndexByte(name, 0) >= 0 || len(key) < 1 || len(key) > MaxKeyLen || hits < 0 || r.Algorithm > GCRA {
			t.Fatalf("accepted %+v", r)
		}
		if r.Limit != (Limit{Algorithm: r.Algorithm}) {
			if limit < 0 || limit > MaxLimit || window < MinWindowMS || window > MaxWindowMS || burst < 0 || burst > MaxLimit || (r.Algorithm == SlidingLog && limit > MaxLogLimit) {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}
