package bucket

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Calendar windows in a named time zone (Limit.CalendarTZ): the zone's
// rules come from package time, which reads the host's tz database and,
// where the host has none (a FROM scratch image), the copy the sluice
// binary carries (time/tzdata). Every node deciding a key must use the
// same rules; docs/algorithms.md says so.

// MaxZoneName bounds the length of a calendar_tz name. IANA names are at
// most 30 bytes today ("America/Argentina/ComodRivadavia").
const MaxZoneName = 64

// zones caches the locations of the zone names that were validated, by
// name. It holds only names the tz database knows, so it is bounded by
// that database (about 600 names) whatever the requests carry.
var zones sync.Map // string → *time.Location

// LoadZone returns the location of an IANA time zone name, as
// Limit.CalendarTZ takes it: "UTC" or an area/location name such as
// "Europe/Berlin". "Local" is refused (it is whatever zone the deciding
// node runs in, and nodes may differ), as are names that are too long,
// hold characters no IANA name has, or that the tz database does not know.
func LoadZone(name string) (*time.Location, error) {
	if l, ok := zones.Load(name); ok {
		return l.(*time.Location), nil
	}
	switch {
	case name == "":
		return nil, fmt.Errorf("calendar_tz is empty")
	case len(name) > MaxZoneName:
		return nil, fmt.Errorf("calendar_tz is %d bytes, more than %d", len(name), MaxZoneName)
	case name == "Local":
		return nil, fmt.Errorf(`calendar_tz "Local" is the deciding node's own zone, which nodes may not share: name the zone, e.g. "Europe/Berlin"`)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '/' || c == '_' || c == '-' || c == '+') {
			return nil, fmt.Errorf("calendar_tz %q: byte %d (%q) is not in an IANA time zone name", name, i, c)
		}
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("calendar_tz %q: not a time zone of the tz database (want an IANA name such as Europe/Berlin or UTC)", name)
	}
	zones.Store(name, loc)
	return loc, nil
}

// zoneOf is the location of a validated limit's calendar zone: nil for
// UTC (no CalendarTZ), which windowAt computes without package time.
func zoneOf(lim *Limit) *time.Location {
	if lim.CalendarTZ == "" || lim.Calendar == CalendarNone {
		return nil
	}
	if l, ok := zones.Load(lim.CalendarTZ); ok {
		return l.(*time.Location)
	}
	// Not validated here (Limit.Validate loads every zone it accepts):
	// load it now; a name this node cannot load counts in UTC, which
	// only a node whose tz database lacks a zone its peers have reaches.
	l, err := LoadZone(lim.CalendarTZ)
	if err != nil {
		return nil
	}
	return l
}

// zoneWindowAt is windowAt for a calendar in loc: the local day, week
// (from Monday) or month that holds t, from local midnight to local
// midnight, so that a day is 23 or 25 hours long across a daylight-saving
// change. Where a change skips midnight itself, the day starts at the
// first instant that exists (time.Date's normalisation), and the window
// is moved so that start ≤ t < end always holds.
func zoneWindowAt(cal Calendar, loc *time.Location, t int64) (start, end int64) {
	lt := time.Unix(0, t).In(loc)
	y, m, d := lt.Date()
	// at(s) is the first instant of the first local date of the s-th
	// window after the one holding lt by the calendar: window s is
	// [at(s), at(s+1)).
	var at func(s int) int64
	switch cal {
	case CalendarDay:
		at = func(s int) int64 { return firstInstant(y, m, d+s, loc) }
	case CalendarWeek:
		d -= (int(lt.Weekday()) + 6) % 7 // back to Monday
		at = func(s int) int64 { return firstInstant(y, m, d+7*s, loc) }
	default: // CalendarMonth
		at = func(s int) int64 { return firstInstant(y, m+time.Month(s), 1, loc) }
	}
	s := 0
	start, end = at(0), at(1)
	for range 2 {
		switch {
		case t < start:
			s--
		case t >= end && end < math.MaxInt64:
			s++
		default:
			return max(start, 0), end
		}
		start, end = at(s), at(s+1)
	}
	return max(start, 0), end
}

// firstInstant is the first instant whose date in loc is the date (y, m,
// d), normalised as time.Date does (d 32 of January is February 1): its
// local midnight, or, where a change of offset skips midnight (America/
// Havana) or the whole date (Pacific/Apia, 2011-12-30), the instant of
// that change. For a midnight that does not exist time.Date may return
// an instant of the day before; the change ends the zone in effect then.
func firstInstant(y int, m time.Month, d int, loc *time.Location) int64 {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	if ly, lm, ld := t.Date(); time.Date(ly, lm, ld, 0, 0, 0, 0, time.UTC).Before(want) {
		if _, end := t.ZoneBounds(); !end.IsZero() {
			t = end
		}
	}
	return zoneNS(t)
}

// zoneNS is t in Unix nanoseconds, saturating at the int64 range.
func zoneNS(t time.Time) int64 {
	s := t.Unix()
	switch {
	case s >= math.MaxInt64/1_000_000_000:
		return math.MaxInt64
	case s <= math.MinInt64/1_000_000_000:
		return math.MinInt64
	}
	return t.UnixNano()
}
