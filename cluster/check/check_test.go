package check

import (
	"math"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
)

// slidingWindow is a sliding-window counter limit.
func slidingWindow(limit, windowMS int64) bucket.Limit {
	return bucket.Limit{Algorithm: bucket.SlidingWindow, Limit: limit, WindowMS: windowMS}
}

// TestRequestValidate has one row per rule of docs/architecture.md §5, on both sides of
// each bound. want is "" for a valid request, else a piece of the message,
// which must say what is wrong.
// One table of cases; long on purpose: each case reads alone.
func TestRequestValidate(t *testing.T) {
	t.Parallel()
	ok := Request{Name: "api.create_url", Key: "user:42", Hits: 1, Limit: slidingWindow(10, 60_000)}
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
		{"limit 2^40", with(func(r *Request) { r.Limit.Limit = bucket.MaxLimit }), ""},
		{"limit 2^40+1", with(func(r *Request) { r.Limit.Limit = bucket.MaxLimit + 1 }), "limit is 1099511627777, more than 2^40"},
		{"limit MaxInt64", with(func(r *Request) { r.Limit.Limit = math.MaxInt64 }), "more than 2^40"},
		{"window 0", with(func(r *Request) { r.WindowMS = 0 }), "window is 0 ms, must be at least 1 ms"},
		{"window negative", with(func(r *Request) { r.WindowMS = -5 }), "window is -5 ms, must be at least 1 ms"},
		{"window 1 ms", with(func(r *Request) { r.WindowMS = 1 }), ""},
		{"window 366 days", with(func(r *Request) { r.WindowMS = 366 * 24 * 3600 * 1000 }), ""},
		{"window 366 days + 1 ms", with(func(r *Request) { r.WindowMS = 366*24*3600*1000 + 1 }), "window is 31622400001 ms, more than 366 days"},
		{"window MaxInt64", with(func(r *Request) { r.WindowMS = math.MaxInt64 }), "more than 366 days"},
		{"burst negative", with(func(r *Request) { r.Burst = -1 }), "burst is -1, must be >= 0"},
		{"burst 0", with(func(r *Request) { r.Burst = 0 }), ""},
		{"burst 2^40", with(func(r *Request) { r.Burst = bucket.MaxLimit }), ""},
		{"burst 2^40+1", with(func(r *Request) { r.Burst = bucket.MaxLimit + 1 }), "burst is 1099511627777, more than 2^40"},
		{"algorithm unspecified", with(func(r *Request) { r.Algorithm = bucket.AlgorithmUnspecified }), ""},
		{"algorithm 7", with(func(r *Request) { r.Algorithm = 7 }), "unknown algorithm 7"},
		{"algorithm 255", with(func(r *Request) { r.Algorithm = 255 }), "unknown algorithm 255"},
		{"sliding_log", with(func(r *Request) { r.Algorithm = bucket.SlidingLog }), ""},
		{"token_bucket", with(func(r *Request) { r.Algorithm = bucket.TokenBucket; r.Burst = 5 }), ""},
		{"leaky_bucket", with(func(r *Request) { r.Algorithm = bucket.LeakyBucket }), ""},
		{"leaky_bucket shaping", with(func(r *Request) { r.Algorithm = bucket.LeakyBucket; r.Shaping = true }), ""},
		{"fixed_window", with(func(r *Request) { r.Algorithm = bucket.FixedWindow }), ""},
		{"gcra", with(func(r *Request) { r.Algorithm = bucket.GCRA }), ""},
		{"sliding_log at its cap", with(func(r *Request) { r.Algorithm = bucket.SlidingLog; r.Limit.Limit = bucket.MaxLogLimit }), ""},
		{"sliding_log over its cap", with(func(r *Request) { r.Algorithm = bucket.SlidingLog; r.Limit.Limit = bucket.MaxLogLimit + 1 }), "sliding_log keeps one timestamp per hit: a limit of 10001 (with its soft or elastic headroom) is more than its cap of 10000"},
		{"sliding_log soft headroom over its cap", with(func(r *Request) {
			r.Algorithm, r.Limit.Limit, r.Mode, r.SoftPercent = bucket.SlidingLog, 10_000, bucket.ModeSoft, 1
		}), "a limit of 10100"},
		{"sliding_log elastic ceiling over its cap", with(func(r *Request) {
			r.Algorithm, r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.SlidingLog, bucket.ModeElastic, 20_000, 50
		}), "a limit of 20000"},
		{"sub_windows 60", with(func(r *Request) { r.SubWindows = 60 }), ""},
		{"sub_windows 1000", with(func(r *Request) { r.SubWindows = bucket.MaxSubWindows }), ""},
		{"sub_windows 1001", with(func(r *Request) { r.SubWindows = 1001 }), "sub_windows is 1001, more than 1000"},
		{"sub_windows negative", with(func(r *Request) { r.SubWindows = -1 }), "sub_windows is -1, must be >= 0"},
		{"sub_windows on unspecified", with(func(r *Request) { r.Algorithm = bucket.AlgorithmUnspecified; r.SubWindows = 2 }), ""},
		{"sub_windows 1 on gcra", with(func(r *Request) { r.Algorithm = bucket.GCRA; r.SubWindows = 1 }), ""},
		{"sub_windows on gcra", with(func(r *Request) { r.Algorithm = bucket.GCRA; r.SubWindows = 2 }), "sub_windows applies only to sliding_window, not gcra"},
		{"shaping on gcra", with(func(r *Request) { r.Algorithm = bucket.GCRA; r.Shaping = true }), "shaping applies only to leaky_bucket, not gcra"},
		{"calendar day", with(func(r *Request) { r.Algorithm = bucket.FixedWindow; r.Calendar = bucket.CalendarDay }), ""},
		{"calendar month", with(func(r *Request) { r.Algorithm = bucket.FixedWindow; r.Calendar = bucket.CalendarMonth }), ""},
		{"calendar unknown", with(func(r *Request) { r.Algorithm = bucket.FixedWindow; r.Calendar = 4 }), "unknown calendar 4"},
		{"calendar on sliding_window", with(func(r *Request) { r.Calendar = bucket.CalendarWeek }), "calendar windows apply only to fixed_window, not sliding_window"},
		{"mode unknown", with(func(r *Request) { r.Mode = 3 }), "unknown mode 3"},
		{"soft 10%", with(func(r *Request) { r.Mode, r.SoftPercent = bucket.ModeSoft, 10 }), ""},
		{"soft 1000%", with(func(r *Request) { r.Mode, r.SoftPercent = bucket.ModeSoft, 1000 }), ""},
		{"soft 0%", with(func(r *Request) { r.Mode = bucket.ModeSoft }), "mode soft needs soft_percent in 1..1000, not 0"},
		{"soft 1001%", with(func(r *Request) { r.Mode, r.SoftPercent = bucket.ModeSoft, 1001 }), "mode soft needs soft_percent in 1..1000, not 1001"},
		{"soft_percent without mode soft", with(func(r *Request) { r.SoftPercent = 10 }), "soft_percent applies only to mode soft, not hard"},
		{"elastic", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.ModeElastic, 20, 70 }), ""},
		{"elastic ceiling 2^40", with(func(r *Request) {
			r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.ModeElastic, bucket.MaxLimit, 100
		}), ""},
		{"elastic ceiling at the limit", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.ModeElastic, 10, 70 }), "mode elastic needs elastic_ceiling above the limit 10 and at most 2^40, not 10"},
		{"elastic ceiling over 2^40", with(func(r *Request) {
			r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.ModeElastic, bucket.MaxLimit+1, 70
		}), "not 1099511627777"},
		{"elastic load 0%", with(func(r *Request) { r.Mode, r.ElasticCeiling = bucket.ModeElastic, 20 }), "mode elastic needs elastic_load_percent in 1..100, not 0"},
		{"elastic load 101%", with(func(r *Request) { r.Mode, r.ElasticCeiling, r.ElasticLoadPercent = bucket.ModeElastic, 20, 101 }), "not 101"},
		{"elastic fields without mode elastic", with(func(r *Request) { r.ElasticCeiling = 20 }), "elastic_ceiling and elastic_load_percent apply only to mode elastic, not hard"},
		{"elastic load without mode elastic", with(func(r *Request) { r.Mode, r.SoftPercent, r.ElasticLoadPercent = bucket.ModeSoft, 5, 50 }), "apply only to mode elastic, not soft"},
		{"count_refused", with(func(r *Request) { r.CountRefused = true }), ""},
		// Limit, window and burst all 0: the limit comes from the rules for Name.
		{"limit from rules", with(func(r *Request) { r.Limit = bucket.Limit{} }), ""},
		{"limit from rules, algorithm named", with(func(r *Request) { r.Limit = bucket.Limit{Algorithm: bucket.GCRA} }), ""},
		{"limit from rules, unknown algorithm", with(func(r *Request) { r.Limit = bucket.Limit{Algorithm: 9} }), "unknown algorithm 9"},
		{"limit from rules, bad key still refused", with(func(r *Request) { r.Limit = bucket.Limit{}; r.Key = "" }), "key is empty"},
		{"limit from rules, bad hits still refused", with(func(r *Request) { r.Limit = bucket.Limit{}; r.Hits = -2 }), "hits is -2"},
		{"window without a limit", with(func(r *Request) { r.Limit = bucket.Limit{WindowMS: 1000} }), ""},
		{"burst alone is checked", with(func(r *Request) { r.Limit = bucket.Limit{Burst: -1} }), "window is 0 ms"},
		{"limit from rules, unknown mode", with(func(r *Request) { r.Limit = bucket.Limit{Mode: 255} }), "unknown mode 255"},
		{"limit from rules, unknown calendar", with(func(r *Request) { r.Limit = bucket.Limit{Calendar: 255} }), "unknown calendar 255"},
		// More: further limits on the same key.
		{"more, one limit", with(func(r *Request) { r.More = []bucket.Limit{slidingWindow(500, 3_600_000)} }), ""},
		{"more, every option", with(func(r *Request) {
			r.More = []bucket.Limit{
				{Algorithm: bucket.SlidingWindow, Limit: 1000, WindowMS: 3_600_000, SubWindows: 60, CountRefused: true},
				{Algorithm: bucket.LeakyBucket, Limit: 5, WindowMS: 1000, Burst: 10, Shaping: true},
				{Algorithm: bucket.FixedWindow, Limit: 10_000, WindowMS: 1, Calendar: bucket.CalendarMonth, Mode: bucket.ModeSoft, SoftPercent: 10},
				{Algorithm: bucket.GCRA, Limit: 5, WindowMS: 1000, Mode: bucket.ModeElastic, ElasticCeiling: 8, ElasticLoadPercent: 70},
			}
		}), ""},
		{"more alone (inline all zero)", with(func(r *Request) {
			r.Limit = bucket.Limit{}
			r.More = []bucket.Limit{slidingWindow(5, 1000), slidingWindow(20, 60_000)}
		}), ""},
		{"more alone, explicit zero limit in more", with(func(r *Request) { r.Limit = bucket.Limit{}; r.More = []bucket.Limit{slidingWindow(0, 1000)} }), ""},
		{"more alone, 16 limits", with(func(r *Request) { r.Limit = bucket.Limit{}; r.More = repeatLimit(slidingWindow(5, 1000), 16) }), ""},
		{"more alone, 17 limits", with(func(r *Request) { r.Limit = bucket.Limit{}; r.More = repeatLimit(slidingWindow(5, 1000), 17) }), "more than 16 limits in one request"},
		{"inline and 15 more", with(func(r *Request) { r.More = repeatLimit(slidingWindow(5, 1000), 15) }), ""},
		{"inline and 16 more", with(func(r *Request) { r.More = repeatLimit(slidingWindow(5, 1000), 16) }), "more than 16 limits in one request"},
		{"more, many limits", with(func(r *Request) { r.More = make([]bucket.Limit, 100_000) }), "more than 16 limits"},
		{"more, all-zero entry", with(func(r *Request) { r.More = []bucket.Limit{slidingWindow(5, 1000), slidingWindow(1, 1), {}} }), "limits[2]: window is 0 ms, must be at least 1 ms"},
		{"more, bad window", with(func(r *Request) { r.More = []bucket.Limit{slidingWindow(5, bucket.MaxWindowMS+1)} }), "limits[0]: window is 31622400001 ms, more than 366 days"},
		{"more, negative limit", with(func(r *Request) { r.More = []bucket.Limit{slidingWindow(5, 1000), slidingWindow(-1, 1000)} }), "limits[1]: limit is -1, must be >= 0"},
		{"more, limit over 2^40", with(func(r *Request) { r.More = []bucket.Limit{slidingWindow(bucket.MaxLimit+1, 1000)} }), "limits[0]: limit is 1099511627777, more than 2^40"},
		{"more, negative burst", with(func(r *Request) {
			r.More = []bucket.Limit{{Algorithm: bucket.TokenBucket, Limit: 5, WindowMS: 1000, Burst: -1}}
		}), "limits[0]: burst is -1"},
		{"more, unknown algorithm", with(func(r *Request) { r.More = []bucket.Limit{{Algorithm: 255, Limit: 5, WindowMS: 1000}} }), "limits[0]: unknown algorithm 255"},
		{"more, unknown mode", with(func(r *Request) { r.More = []bucket.Limit{{Mode: 255, Limit: 5, WindowMS: 1000}} }), "limits[0]: unknown mode 255"},
		{"more, unknown calendar", with(func(r *Request) {
			r.More = []bucket.Limit{{Algorithm: bucket.FixedWindow, Calendar: 255, Limit: 5, WindowMS: 1000}}
		}), "limits[0]: unknown calendar 255"},
		{"more, sub_windows on gcra", with(func(r *Request) {
			r.More = []bucket.Limit{{Algorithm: bucket.GCRA, Limit: 5, WindowMS: 1000, SubWindows: 2}}
		}), "limits[0]: sub_windows applies only to sliding_window, not gcra"},
		{"more, soft without percent", with(func(r *Request) { r.More = []bucket.Limit{{Limit: 5, WindowMS: 1000, Mode: bucket.ModeSoft}} }), "limits[0]: mode soft needs soft_percent"},
		{"more, elastic ceiling at the limit", with(func(r *Request) {
			r.More = []bucket.Limit{{Limit: 5, WindowMS: 1000, Mode: bucket.ModeElastic, ElasticCeiling: 5, ElasticLoadPercent: 50}}
		}), "limits[0]: mode elastic needs elastic_ceiling above the limit 5"},
		{"more, sliding_log over its cap", with(func(r *Request) {
			r.More = []bucket.Limit{{Algorithm: bucket.SlidingLog, Limit: bucket.MaxLogLimit + 1, WindowMS: 1000}}
		}), "limits[0]: sliding_log keeps one timestamp per hit"},
		{"more, bad inline still refused", with(func(r *Request) { r.WindowMS = 0; r.More = []bucket.Limit{slidingWindow(5, 1000)} }), "window is 0 ms"},
		{"more, inline explicit zero limit is ambiguous", with(func(r *Request) { r.Limit.Limit = 0; r.More = []bucket.Limit{slidingWindow(5, 1000)} }), "the inline limit is 0 but its other fields are set"},
		{"more, inline algorithm alone is ambiguous", with(func(r *Request) {
			r.Limit = bucket.Limit{Algorithm: bucket.GCRA}
			r.More = []bucket.Limit{slidingWindow(5, 1000)}
		}), "the inline limit is 0 but its other fields are set"},
		{"more, bad key still refused", with(func(r *Request) { r.Key = ""; r.More = []bucket.Limit{slidingWindow(5, 1000)} }), "key is empty"},
		{"more, bad hits still refused", with(func(r *Request) { r.Hits = -1; r.More = []bucket.Limit{slidingWindow(5, 1000)} }), "hits is -1"},
		{"more empty but not nil", with(func(r *Request) { r.More = []bucket.Limit{} }), ""},
		{"more empty, limit from rules", with(func(r *Request) { r.Limit = bucket.Limit{}; r.More = []bucket.Limit{} }), ""},
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

func repeatLimit(l bucket.Limit, n int) []bucket.Limit {
	ls := make([]bucket.Limit, n)
	for i := range ls {
		ls[i] = l
	}
	return ls
}

func BenchmarkValidate(b *testing.B) {
	b.ReportAllocs()
	r := Request{Name: "api.create_url", Key: "user:4242424242", Hits: 1, Limit: slidingWindow(100, 60_000)}
	for b.Loop() {
		if err := r.Validate(); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzValidate: Validate never panics, and whatever it accepts is inside
// the bounds of docs/architecture.md §5.
func FuzzValidate(f *testing.F) {
	f.Add("api", "user:1", int64(1), uint8(1), int64(10), int64(1000), int64(0))
	f.Add("", "", int64(-1), uint8(9), int64(-1), int64(0), int64(-1))
	f.Add("a\x00", "k", int64(0), uint8(0), int64(0), int64(0), int64(0))
	f.Fuzz(func(t *testing.T, name, key string, hits int64, alg uint8, limit, window, burst int64) {
		r := Request{Name: name, Key: key, Hits: hits, Limit: bucket.Limit{Algorithm: bucket.Algorithm(alg), Limit: limit, WindowMS: window, Burst: burst}}
		err := r.Validate()
		// The same limit as the only one of More is accepted exactly when
		// the request's name, key and hits are and the limit itself is.
		m := Request{Name: name, Key: key, Hits: hits, More: []bucket.Limit{r.Limit}}
		if mErr, want := m.Validate(), bucket.ValidateKey(name, key) == nil && hits >= 0 && r.Limit.Validate() == nil; (mErr == nil) != want {
			t.Fatalf("Validate of %+v = %v, want accepted %v", m, mErr, want)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if len(name) < 1 || len(name) > bucket.MaxNameLen || strings.IndexByte(name, 0) >= 0 || len(key) < 1 || len(key) > bucket.MaxKeyLen || hits < 0 || r.Algorithm > bucket.GCRA {
			t.Fatalf("accepted %+v", r)
		}
		if r.Limit != (bucket.Limit{Algorithm: r.Algorithm}) {
			if limit < 0 || limit > bucket.MaxLimit || window < bucket.MinWindowMS || window > bucket.MaxWindowMS || burst < 0 || burst > bucket.MaxLimit || (r.Algorithm == bucket.SlidingLog && limit > bucket.MaxLogLimit) {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}

// FuzzValidateReservation: Validate accepts a reserve or a settle exactly
// within their bounds, and never both at once.
func FuzzValidateReservation(f *testing.F) {
	f.Add(int64(5), int64(60_000), "", int64(0), false)
	f.Add(int64(0), int64(0), "abc", int64(250), false)
	f.Add(int64(1), int64(1), "abc", int64(-1), true)
	f.Add(int64(5), int64(60_000), "", int64(5), false) // actual without a settle
	f.Fuzz(func(t *testing.T, hits, ttl int64, id string, actual int64, more bool) {
		r := Request{Name: "llm", Key: "u", Hits: hits, ReserveTTLMS: ttl, ReservationID: id, Actual: actual,
			Limit: bucket.Limit{Algorithm: bucket.TokenBucket, Limit: 10, WindowMS: 1000}}
		if more {
			r.More, r.Limit = []bucket.Limit{r.Limit}, bucket.Limit{}
		}
		err := r.Validate()
		reserve, settle := ttl != 0, id != ""
		want := hits >= 0 && !(more && (reserve || settle)) && !(reserve && settle) &&
			(!reserve || (ttl > 0 && ttl <= MaxReserveTTLMS && hits > 0)) &&
			(!settle || (hits == 0 && actual >= 0 && actual <= bucket.MaxLimit && len(id) <= MaxReservationIDLen)) &&
			(settle || actual == 0)
		if (err == nil) != want {
			t.Fatalf("%+v: %v, want accepted %v", r, err, want)
		}
	})
}

// FuzzValidateOp: Validate accepts an operation on a concurrency limit
// exactly within its bounds.
func FuzzValidateOp(f *testing.F) {
	f.Add(uint8(1), int64(0), int64(3), int64(30_000), int64(0))
	f.Add(uint8(2), int64(7), int64(3), int64(30_000), int64(0))
	f.Add(uint8(3), int64(7), int64(0), int64(0), int64(0))
	f.Add(uint8(4), int64(7), int64(3), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, op uint8, id, limit, ttl, hits int64) {
		r := Request{Name: "jobs", Key: "t", Hits: hits, Op: LeaseOp(op), LeaseID: id, Limit: bucket.Limit{Limit: limit, WindowMS: ttl}}
		err := r.Validate()
		o := LeaseOp(op)
		want := hits >= 0 && o <= OpRelease &&
			(o != OpNone || id == 0) &&
			(o == OpNone || hits == 0) &&
			(o != OpAcquire || id == 0) &&
			(o == OpNone || o == OpAcquire || id > 0) &&
			(o == OpNone || o == OpRelease || (limit >= 1 && limit <= bucket.MaxHolders && ttl >= 1 && ttl <= bucket.MaxHoldTTLMS)) &&
			(r.Limit == (bucket.Limit{}) || r.Limit.Validate() == nil || (limit == 0 && ttl == 0))
		if (err == nil) != want {
			t.Fatalf("%+v: %v, want accepted %v", r, err, want)
		}
	})
}
