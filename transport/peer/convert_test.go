package peer

import (
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
)

// fullRequest is a valid request that sets every field of check.Request,
// the options of the inline limit and three further limits.
func fullRequest() check.Request {
	return check.Request{
		Name: "login", Key: "user:42", Hits: 3,
		Limit: bucket.Limit{
			Algorithm: bucket.SlidingWindow, Limit: 1000, WindowMS: 3_600_000, SubWindows: 60,
			Mode: bucket.ModeSoft, SoftPercent: 10, CountRefused: true,
		},
		More: []bucket.Limit{
			{Algorithm: bucket.LeakyBucket, Limit: 5, WindowMS: 1000, Burst: 10, Shaping: true},
			{Algorithm: bucket.GCRA, Limit: 20, WindowMS: 60_000, Burst: 5, Mode: bucket.ModeElastic, ElasticCeiling: 40, ElasticLoadPercent: 70},
			{Algorithm: bucket.FixedWindow, Limit: 10_000, WindowMS: 86_400_000, Calendar: bucket.CalendarMonth, CalendarTZ: "Europe/Berlin", CountRefused: true},
		},
	}
}

func TestRequestRoundTrip(t *testing.T) {
	t.Parallel()
	if full := fullRequest(); full.Validate() != nil {
		t.Fatalf("fullRequest is invalid: %v", full.Validate())
	}
	for _, r := range []check.Request{
		fullRequest(),
		req("k", 1),
		{Name: "n", Key: "k"}, // limit from the rules
		{Name: "n", Key: "k", Hits: 1, More: []bucket.Limit{{Limit: 5, WindowMS: 1000}}}, // limits alone
		// Invalid values travel unchanged: the receiver refuses them.
		{Name: "n", Key: "k", Limit: bucket.Limit{Algorithm: 255, Mode: 255, Calendar: 255, Limit: -1}, More: []bucket.Limit{{Mode: 7, Calendar: 9}}},
		{Name: "n", Key: "k", Limit: bucket.Limit{Algorithm: bucket.FixedWindow, Limit: 5, WindowMS: 1000, Calendar: bucket.CalendarDay, CalendarTZ: "Mars/Olympus_Mons"}},
	} {
		m := RequestToProto(r)
		got := RequestFromProto(m)
		if !reflect.DeepEqual(got, r) {
			t.Errorf("round trip of %+v\ngave      %+v\n(wire %v)", r, got, m)
		}
		// And through the wire encoding.
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var m2 sluicev1.RateLimitRequest
		if err := proto.Unmarshal(b, &m2); err != nil {
			t.Fatal(err)
		}
		if got := RequestFromProto(&m2); !reflect.DeepEqual(got, r) {
			t.Errorf("encoded round trip of %+v\ngave               %+v", r, got)
		}
	}
}

// fillEveryField sets every field of m (recursively for message fields) to a
// value that is not its zero value, different from field to field, so a
// field the conversion forgets shows up as a difference.
func fillEveryField(t *testing.T, m protoreflect.Message, seed int64) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		n := seed + int64(fd.Number())
		switch {
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			l := m.Mutable(fd).List()
			for j := range 3 {
				e := l.NewElement()
				fillEveryField(t, e.Message(), n*10+int64(j))
				l.Append(e)
			}
		case fd.IsList() || fd.IsMap():
			t.Fatalf("field %s: fillEveryField does not handle this kind", fd.FullName())
		case fd.Kind() == protoreflect.Int64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(n))
		case fd.Kind() == protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
		case fd.Kind() == protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(string(fd.Name())))
		case fd.Kind() == protoreflect.EnumKind:
			vals := fd.Enum().Values()
			m.Set(fd, protoreflect.ValueOfEnum(vals.Get(1+int(n)%(vals.Len()-1)).Number()))
		default:
			t.Fatalf("field %s: fillEveryField does not handle kind %v", fd.FullName(), fd.Kind())
		}
	}
}

// Every field of RateLimitRequest and Limit, those added later included,
// survives proto → bucket → proto.
func TestRequestProtoRoundTripEveryField(t *testing.T) {
	t.Parallel()
	m := &sluicev1.RateLimitRequest{}
	fillEveryField(t, m.ProtoReflect(), 0)
	if len(m.Limits) != 3 || m.Limits[2].Calendar == 0 || m.Mode == 0 {
		t.Fatalf("fillEveryField left fields unset: %v", m)
	}
	if got := RequestToProto(RequestFromProto(m)); !proto.Equal(got, m) {
		t.Fatalf("round trip lost fields:\n in  %v\n out %v", m, got)
	}
	l := &sluicev1.Limit{}
	fillEveryField(t, l.ProtoReflect(), 100)
	if got := LimitToProto(LimitFromProto(l)); !proto.Equal(got, l) {
		t.Fatalf("Limit round trip lost fields:\n in  %v\n out %v", l, got)
	}
}

// Enum numbers the receiver does not know, and numbers outside 0..255, never
// wrap into valid values: Validate refuses them, inline and in limits, with
// and without an inline limit.
func TestInvalidEnumsNeverBecomeValid(t *testing.T) {
	t.Parallel()
	bad := []int32{7, 8, 255, 256, 257, 256 + 2, -1, -255, 1<<31 - 1, -1 << 31} // invalid for all three enums
	valid := func() *sluicev1.RateLimitRequest {
		return &sluicev1.RateLimitRequest{Name: "n", Key: "k", Hits: proto.Int64(1), Limit: 10, WindowMs: 1000, Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW}
	}
	for _, v := range bad {
		for _, tc := range []struct {
			name string
			edit func(m *sluicev1.RateLimitRequest)
			want string
		}{
			{"inline mode", func(m *sluicev1.RateLimitRequest) { m.Mode = sluicev1.Mode(v) }, "unknown mode"},
			{"inline calendar", func(m *sluicev1.RateLimitRequest) { m.Calendar = sluicev1.Calendar(v) }, "unknown calendar"},
			{"rules mode", func(m *sluicev1.RateLimitRequest) { m.Limit, m.WindowMs, m.Mode = 0, 0, sluicev1.Mode(v) }, "unknown mode"},
			{"rules calendar", func(m *sluicev1.RateLimitRequest) { m.Limit, m.WindowMs, m.Calendar = 0, 0, sluicev1.Calendar(v) }, "unknown calendar"},
			{"limits algorithm", func(m *sluicev1.RateLimitRequest) {
				m.Limits = []*sluicev1.Limit{{Limit: 5, WindowMs: 1000}, {Limit: 5, WindowMs: 1000, Algorithm: sluicev1.Algorithm(v)}}
			}, "limits[1]: unknown algorithm"},
			{"limits mode", func(m *sluicev1.RateLimitRequest) {
				m.Limits = []*sluicev1.Limit{{Limit: 5, WindowMs: 1000, Mode: sluicev1.Mode(v)}}
			}, "limits[0]: unknown mode"},
			{"limits calendar", func(m *sluicev1.RateLimitRequest) {
				m.Limits = []*sluicev1.Limit{{Limit: 5, WindowMs: 1000, Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, Calendar: sluicev1.Calendar(v)}}
			}, "limits[0]: unknown calendar"},
			{"limits alone, calendar", func(m *sluicev1.RateLimitRequest) {
				m.Limit, m.WindowMs, m.Algorithm = 0, 0, 0
				m.Limits = []*sluicev1.Limit{{Limit: 5, WindowMs: 1000, Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, Calendar: sluicev1.Calendar(v)}}
			}, "limits[0]: unknown calendar"},
		} {
			m := valid()
			if err := validateProto(m); err != nil {
				t.Fatalf("base request refused: %v", err)
			}
			tc.edit(m)
			r := RequestFromProto(m)
			err := validateProto(m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s %d: Validate() = %v, want %q (request %+v)", tc.name, v, err, tc.want, r)
			}
		}
	}
	// The mapping itself: in range unchanged, outside 0..255 to 255.
	for _, tc := range []struct{ in, want int32 }{{0, 0}, {2, 2}, {3, 3}, {255, 255}, {256, 255}, {-1, 255}, {1<<31 - 1, 255}} {
		if got := modeFromProto(sluicev1.Mode(tc.in)); int32(got) != tc.want {
			t.Errorf("modeFromProto(%d) = %d, want %d", tc.in, got, tc.want)
		}
		if got := calendarFromProto(sluicev1.Calendar(tc.in)); int32(got) != tc.want {
			t.Errorf("calendarFromProto(%d) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestRequestFromProtoLimits(t *testing.T) {
	t.Parallel()
	// A nil entry is a zero limit, refused with its index.
	m := &sluicev1.RateLimitRequest{Name: "n", Key: "k", Hits: proto.Int64(1), Limits: []*sluicev1.Limit{{Limit: 5, WindowMs: 1000}, nil}}
	if err := validateProto(m); err == nil || !strings.Contains(err.Error(), "limits[1]: window is 0 ms") {
		t.Errorf("nil entry: Validate() = %v", err)
	}
	// A huge list is converted only as far as needed to refuse it.
	m.Limits = make([]*sluicev1.Limit, 100_000)
	for i := range m.Limits {
		m.Limits[i] = &sluicev1.Limit{Limit: 5, WindowMs: 1000}
	}
	r := RequestFromProto(m)
	if len(r.More) != bucket.MaxLimitsPerRequest+1 {
		t.Errorf("100000 limits converted to %d", len(r.More))
	}
	if err := r.Validate(); err == nil || !strings.Contains(err.Error(), "more than 16 limits") {
		t.Errorf("100000 limits: Validate() = %v", err)
	}
	for _, n := range []int{16, 17} {
		m.Limits = m.Limits[:n]
		err := validateProto(m)
		if (err == nil) != (n == 16) {
			t.Errorf("%d limits alone: Validate() = %v", n, err)
		}
	}
	// With an inline limit, 15 more at most.
	m.Limit, m.WindowMs = 10, 1000
	for _, n := range []int{15, 16} {
		m.Limits = m.Limits[:n]
		err := validateProto(m)
		if (err == nil) != (n == 15) {
			t.Errorf("inline and %d limits: Validate() = %v", n, err)
		}
	}
}

// A reused message (the peer client's) carries no limits of the request it
// held before.
func TestFillRequestReused(t *testing.T) {
	t.Parallel()
	var m sluicev1.RateLimitRequest
	full := fullRequest()
	fillRequest(&m, &full, new(int64))
	if len(m.Limits) != 3 {
		t.Fatalf("limits %v", m.Limits)
	}
	plain := req("k", 1)
	fillRequest(&m, &plain, new(int64))
	if !proto.Equal(&m, RequestToProto(plain)) {
		t.Fatalf("reused message %v, want %v", &m, RequestToProto(plain))
	}
}

func validateProto(m *sluicev1.RateLimitRequest) error {
	r := RequestFromProto(m)
	return r.Validate()
}

func TestRequestFromProtoAlgorithm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   sluicev1.Algorithm
		want bucket.Algorithm
	}{
		{0, bucket.AlgorithmUnspecified}, {1, bucket.SlidingWindow}, {6, bucket.GCRA},
		{7, 7}, {255, 255}, {256, 255}, {257, 255}, {-1, 255}, {1<<31 - 1, 255},
	} {
		if got := RequestFromProto(&sluicev1.RateLimitRequest{Algorithm: tc.in}).Algorithm; got != tc.want {
			t.Errorf("RequestFromProto(algorithm %d) = %d, want %d", tc.in, got, tc.want)
		}
	}
	if r := RequestFromProto(nil); r.Validate() == nil {
		t.Error("nil request converted to a valid one")
	}
	o := OutcomeFromProto(&sluicev1.RateLimitResponse{Status: 9})
	if o.Status != bucket.StatusUnspecified || o.Err == "" {
		t.Errorf("unknown status became %+v", o)
	}
}
