package bucket

import (
	"fmt"
)

// Algorithm selects how a limit is counted. The numbers are those of the
// sluice.v1.Algorithm enum and never change.
type Algorithm uint8

// The algorithms. AlgorithmUnspecified means SlidingWindow.
const (
	AlgorithmUnspecified Algorithm = 0
	SlidingWindow        Algorithm = 1
	SlidingLog           Algorithm = 2
	TokenBucket          Algorithm = 3
	LeakyBucket          Algorithm = 4
	FixedWindow          Algorithm = 5
	GCRA                 Algorithm = 6
)

var algorithmNames = [...]string{
	AlgorithmUnspecified: "unspecified",
	SlidingWindow:        "sliding_window",
	SlidingLog:           "sliding_log",
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	GCRA:                 "gcra",
}

// String returns the name used on the command line and in rules files.
func (a Algorithm) String() string {
	if a == Holders {
		return "holders" // a concurrency limit's state; no limit names it
	}
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm returns the algorithm named s ("sliding_window", "gcra", ...).
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if i > 0 && n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want sliding_window, sliding_log, token_bucket, leaky_bucket, fixed_window or gcra)", s)
}

// Status is the verdict of a check. The numbers are those of the
// sluice.v1.Status enum.
type Status uint8

// The statuses. StatusUnspecified goes with an error.
const (
	StatusUnspecified Status = 0
	UnderLimit        Status = 1
	OverLimit         Status = 2
)

// Limits of docs/architecture.md §5, checked before any state changes.
const (
	MaxNameLen  = 128
	MaxKeyLen   = 1024
	MaxLimit    = int64(1) << 40
	MinWindowMS = int64(1)
	MaxWindowMS = int64(366 * 24 * 60 * 60 * 1000)
	// MaxLimitsPerRequest is the most limits one check may carry (check.Request), the
	// embedded Limit and More together.
	MaxLimitsPerRequest = 16
)

// More limits of this package, checked by Limit.Validate.
const (
	// MaxLogLimit is the largest limit the sliding log accepts (with its
	// soft or elastic headroom): it keeps one 8-byte timestamp per hit
	// admitted in the trailing window.
	MaxLogLimit = int64(10_000)
	// MaxSubWindows is the largest number of sub-windows of a sliding
	// window.
	MaxSubWindows = int64(1000)
	// MaxSoftPercent is the largest SoftPercent.
	MaxSoftPercent = int64(1000)
)

// Limit is one limit: at most Limit hits per WindowMS milliseconds, counted by
// Algorithm. Burst is the capacity of the bucket algorithms (0 means Limit).
//
// The fields after Burst are optional; their zero values give the plain
// behaviour: one sliding-window counter, hard limits, refused hits consume
// nothing, windows aligned to the epoch. docs/algorithms.md describes each.
type Limit struct {
	Algorithm Algorithm
	Limit     int64
	WindowMS  int64
	Burst     int64

	// SubWindows, for SlidingWindow only: 0 or 1 is the classic counter of
	// two windows; n in 2..MaxSubWindows counts the window in n
	// sub-windows of ceil(window / n) each, the oldest weighted by its
	// overlap, so that the error is bounded by one sub-window.
	SubWindows int64
	// Shaping, for LeakyBucket only: admit a request while the queue has
	// room, with RetryAfterMS on the allowed answer saying how long to
	// delay it (the time for the queue ahead of it to drain).
	Shaping bool
	// Mode is how hard the limit is: ModeHard (the default), ModeSoft or
	// ModeElastic.
	Mode Mode
	// SoftPercent, for ModeSoft: admit up to this many percent over the
	// limit (1..MaxSoftPercent), while Remaining counts against Limit.
	SoftPercent int64
	// ElasticCeiling, for ModeElastic: the limit in force while the node's
	// load is below ElasticLoadPercent (> Limit, ≤ 2^40).
	ElasticCeiling int64
	// ElasticLoadPercent, for ModeElastic: the load, in percent of the
	// node's capacity (1..100), below which ElasticCeiling applies. See
	// DecideLoad for what load means.
	ElasticLoadPercent int64
	// CountRefused: refused hits consume too (saturating at the limit: a
	// client that keeps retrying stays refused until it pauses).
	CountRefused bool
	// Global: with regions (docs/regions.md), the limit is shared by every
	// region instead of counted in each: the key's home region holds the
	// count and lends the others slices of it. Only for a single hard
	// token bucket, fixed window (not calendar) or sliding-window counter
	// (without sub-windows). Without regions it changes nothing.
	Global bool
	// Calendar, for FixedWindow only: windows follow UTC calendar edges
	// (day, week from Monday, month) instead of multiples of WindowMS.
	Calendar Calendar
	// CalendarTZ, with Calendar only: the IANA time zone whose calendar
	// the windows follow ("Europe/Berlin"; LoadZone), from local midnight
	// to local midnight, so that a day is 23 or 25 hours long across a
	// daylight-saving change. "" is UTC.
	CalendarTZ string
}

// Mode is the throttling mode of a limit.
type Mode uint8

// The modes.
const (
	// ModeHard refuses every hit over the limit.
	ModeHard Mode = 0
	// ModeSoft admits up to SoftPercent over the limit.
	ModeSoft Mode = 1
	// ModeElastic admits up to ElasticCeiling while the node's load is
	// below ElasticLoadPercent, and up to Limit otherwise.
	ModeElastic Mode = 2
)

var modeNames = [...]string{ModeHard: "hard", ModeSoft: "soft", ModeElastic: "elastic"}

// String returns the name used in rules files.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode returns the mode named s ("hard", "soft", "elastic"); "" is
// ModeHard.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return ModeHard, nil
	}
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown mode %q (want hard, soft or elastic)", s)
}

// Calendar selects calendar windows in UTC for FixedWindow.
type Calendar uint8

// The calendars. CalendarNone aligns windows to multiples of WindowMS since
// the epoch.
const (
	CalendarNone  Calendar = 0
	CalendarDay   Calendar = 1 // from 00:00 UTC
	CalendarWeek  Calendar = 2 // from Monday 00:00 UTC
	CalendarMonth Calendar = 3 // from the 1st, 00:00 UTC
)

var calendarNames = [...]string{CalendarNone: "none", CalendarDay: "day", CalendarWeek: "week", CalendarMonth: "month"}

// String returns the name used in rules files.
func (c Calendar) String() string {
	if int(c) < len(calendarNames) {
		return calendarNames[c]
	}
	return fmt.Sprintf("calendar(%d)", uint8(c))
}

// ParseCalendar returns the calendar named s ("day", "week", "month",
// "none"); "" is CalendarNone.
func ParseCalendar(s string) (Calendar, error) {
	if s == "" {
		return CalendarNone, nil
	}
	for i, n := range calendarNames {
		if n == s {
			return Calendar(i), nil
		}
	}
	return 0, fmt.Errorf("unknown calendar %q (want day, week, month or none)", s)
}

// Decision is the answer of an algorithm to one request.
type Decision struct {
	Status       Status
	Limit        int64
	Remaining    int64
	ResetAfterMS int64 // until the window or bucket is full again
	// RetryAfterMS is 0 exactly when allowed, except for a shaping leaky
	// bucket, whose allowed answers carry the delay; see docs/algorithms.md.
	RetryAfterMS int64
}

// Allowed reports whether the request was admitted.
func (d Decision) Allowed() bool { return d.Status == UnderLimit }

// ValidateKey checks name and key against docs/architecture.md §5.
func ValidateKey(name, key string) error {
	switch {
	case len(name) == 0:
		return fmt.Errorf("name is empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name is %d bytes, more than %d", len(name), MaxNameLen)
	case len(key) == 0:
		return fmt.Errorf("key is empty")
	case len(key) > MaxKeyLen:
		return fmt.Errorf("key is %d bytes, more than %d", len(key), MaxKeyLen)
	}
	for i := 0; i < len(name); i++ {
		if name[i] == 0 {
			return fmt.Errorf("name contains a NUL byte at offset %d", i)
		}
	}
	return nil
}

// ValidateKinds checks that an algorithm, a mode and a calendar are ones
// this package knows: what a request with no limit of its own (its limit
// comes from the rules) must still get right.
func ValidateKinds(a Algorithm, m Mode, c Calendar) error {
	switch {
	case a > GCRA:
		return unknownAlgorithm(a)
	case m > ModeElastic:
		return unknownMode(m)
	case c > CalendarMonth:
		return unknownCalendar(c)
	}
	return nil
}

// Validate checks a limit against docs/architecture.md §5 and the rules of its optional
// fields.
func (l Limit) Validate() error {
	switch {
	case l.Algorithm > GCRA:
		return unknownAlgorithm(l.Algorithm)
	case l.Limit < 0:
		return fmt.Errorf("limit is %d, must be >= 0", l.Limit)
	case l.Limit > MaxLimit:
		return fmt.Errorf("limit is %d, more than 2^40", l.Limit)
	case l.WindowMS < MinWindowMS:
		return fmt.Errorf("window is %d ms, must be at least 1 ms", l.WindowMS)
	case l.WindowMS > MaxWindowMS:
		return fmt.Errorf("window is %d ms, more than 366 days", l.WindowMS)
	case l.Burst < 0:
		return fmt.Errorf("burst is %d, must be >= 0", l.Burst)
	case l.Burst > MaxLimit:
		return fmt.Errorf("burst is %d, more than 2^40", l.Burst)
	case l.SubWindows < 0:
		return fmt.Errorf("sub_windows is %d, must be >= 0", l.SubWindows)
	case l.SubWindows > MaxSubWindows:
		return fmt.Errorf("sub_windows is %d, more than %d", l.SubWindows, MaxSubWindows)
	case l.SubWindows > 1 && l.Algorithm != SlidingWindow && l.Algorithm != AlgorithmUnspecified:
		return fmt.Errorf("sub_windows applies only to sliding_window, not %s", l.Algorithm)
	case l.Shaping && l.Algorithm != LeakyBucket:
		return fmt.Errorf("shaping applies only to leaky_bucket, not %s", l.Algorithm)
	case l.Calendar > CalendarMonth:
		return unknownCalendar(l.Calendar)
	case l.Calendar != CalendarNone && l.Algorithm != FixedWindow:
		return fmt.Errorf("calendar windows apply only to fixed_window, not %s", l.Algorithm)
	case l.CalendarTZ != "" && l.Calendar == CalendarNone:
		return fmt.Errorf("calendar_tz %q applies only to calendar windows (calendar day, week or month)", l.CalendarTZ)
	}
	if l.CalendarTZ != "" {
		if _, err := LoadZone(l.CalendarTZ); err != nil {
			return err
		}
	}
	if err := l.validateMode(); err != nil {
		return err
	}
	if l.Global {
		switch {
		case l.Mode != ModeHard || l.CountRefused:
			return fmt.Errorf("a global limit must be hard and not count refused hits")
		case l.Algorithm == TokenBucket, l.Algorithm == FixedWindow && l.Calendar == CalendarNone,
			(l.Algorithm == SlidingWindow || l.Algorithm == AlgorithmUnspecified) && l.SubWindows <= 1:
		default:
			return fmt.Errorf("a global limit must be token_bucket, fixed_window (not calendar) or sliding_window (without sub_windows), not %s", l.Algorithm)
		}
	}
	if l.Algorithm == SlidingLog {
		if top := max(l.Limit, l.ElasticCeiling, softLimit(l.Limit, l.SoftPercent)); top > MaxLogLimit {
			return fmt.Errorf("sliding_log keeps one timestamp per hit: a limit of %d (with its soft or elastic headroom) is more than its cap of %d; use sliding_window with sub_windows", top, MaxLogLimit)
		}
	}
	return nil
}

func (l Limit) validateMode() error {
	switch {
	case l.Mode > ModeElastic:
		return unknownMode(l.Mode)
	case l.SoftPercent != 0 && l.Mode != ModeSoft:
		return fmt.Errorf("soft_percent applies only to mode soft, not %s", l.Mode)
	case l.Mode == ModeSoft && (l.SoftPercent < 1 || l.SoftPercent > MaxSoftPercent):
		return fmt.Errorf("mode soft needs soft_percent in 1..%d, not %d", MaxSoftPercent, l.SoftPercent)
	case (l.ElasticCeiling != 0 || l.ElasticLoadPercent != 0) && l.Mode != ModeElastic:
		return fmt.Errorf("elastic_ceiling and elastic_load_percent apply only to mode elastic, not %s", l.Mode)
	case l.Mode == ModeElastic && (l.ElasticCeiling <= l.Limit || l.ElasticCeiling > MaxLimit):
		return fmt.Errorf("mode elastic needs elastic_ceiling above the limit %d and at most 2^40, not %d", l.Limit, l.ElasticCeiling)
	case l.Mode == ModeElastic && (l.ElasticLoadPercent < 1 || l.ElasticLoadPercent > 100):
		return fmt.Errorf("mode elastic needs elastic_load_percent in 1..100, not %d", l.ElasticLoadPercent)
	}
	return nil
}

// unknownAlgorithm, unknownMode and unknownCalendar are the errors of an
// enum number outside its values; they list the values by number and name.
func unknownAlgorithm(a Algorithm) error {
	return fmt.Errorf("unknown algorithm %d (want 0 or %s)", a, numbered(int(SlidingWindow), algorithmNames[SlidingWindow:]))
}

func unknownMode(m Mode) error {
	return fmt.Errorf("unknown mode %d (want %s)", m, numbered(0, modeNames[:]))
}

func unknownCalendar(c Calendar) error {
	return fmt.Errorf("unknown calendar %d (want %s)", c, numbered(0, calendarNames[:]))
}

// numbered lists names as "first name, first+1 name or first+2 name".
func numbered(first int, names []string) string {
	var b []byte
	for i, n := range names {
		switch {
		case i > 0 && i == len(names)-1:
			b = append(b, " or "...)
		case i > 0:
			b = append(b, ", "...)
		}
		b = fmt.Appendf(b, "%d %s", first+i, n)
	}
	return string(b)
}
