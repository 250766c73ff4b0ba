package bucket

import (
	"math"
	"strings"
	"testing"
	"time"
)

// at is the instant of a wall-clock time with the given UTC offset in
// hours, as a zone's rules define it (the offsets below are the zones'
// published rules, not this package's output).
func at(y int, m time.Month, d, h, min int, offset float64) int64 {
	return time.Date(y, m, d, h, min, 0, 0, time.FixedZone("", int(offset*3600))).UnixNano()
}

// Calendar windows in a zone run from local midnight to local midnight,
// across both daylight-saving changes of the year: the spring day is 23
// hours long and the autumn day 25, and a count made in the first hour
// of the day holds until the next local midnight, not for 24 hours.
func TestCalendarWindowsInAZone(t *testing.T) {
	t.Parallel()
	const day = 24 * 3600 * 1000 // ms
	daily := func(tz string) Limit {
		return Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: day, Calendar: CalendarDay, CalendarTZ: tz}
	}
	weekly := Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: 7 * day, Calendar: CalendarWeek, CalendarTZ: "America/New_York"}
	monthly := Limit{Algorithm: FixedWindow, Limit: 2, WindowMS: 31 * day, Calendar: CalendarMonth, CalendarTZ: "Europe/Berlin"}
	tests := []struct {
		name       string
		lim        Limit
		start, end int64 // the window, from the zone's rules
		hours      int64 // its length
	}{
		// Europe/Berlin: CET (+1) to CEST (+2) on 2026-03-29 at 02:00,
		// back on 2026-10-25 at 03:00.
		{"Berlin, spring", daily("Europe/Berlin"), at(2026, 3, 29, 0, 0, 1), at(2026, 3, 30, 0, 0, 2), 23},
		{"Berlin, autumn", daily("Europe/Berlin"), at(2026, 10, 25, 0, 0, 2), at(2026, 10, 26, 0, 0, 1), 25},
		{"Berlin, a plain day", daily("Europe/Berlin"), at(2026, 7, 1, 0, 0, 2), at(2026, 7, 2, 0, 0, 2), 24},
		// America/New_York: EST (-5) to EDT (-4) on 2026-03-08 at 02:00,
		// back on 2026-11-01 at 02:00.
		{"New York, spring", daily("America/New_York"), at(2026, 3, 8, 0, 0, -5), at(2026, 3, 9, 0, 0, -4), 23},
		{"New York, autumn", daily("America/New_York"), at(2026, 11, 1, 0, 0, -4), at(2026, 11, 2, 0, 0, -5), 25},
		// 2026-11-02 is a Monday: the week from Monday 2026-10-26 holds
		// the autumn change.
		{"New York, the week of the change", weekly, at(2026, 10, 26, 0, 0, -4), at(2026, 11, 2, 0, 0, -5), 7*24 + 1},
		{"Berlin, March", monthly, at(2026, 3, 1, 0, 0, 1), at(2026, 4, 1, 0, 0, 2), 31*24 - 1},
		{"UTC by name", daily("UTC"), at(2026, 3, 29, 0, 0, 0), at(2026, 3, 30, 0, 0, 0), 24},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := tc.lim.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := (tc.end - tc.start) / int64(time.Hour); got != tc.hours {
				t.Fatalf("the test's window is %d hours, want %d", got, tc.hours)
			}
			// Two hits in the window's first minute use it up, until its
			// end and not a nanosecond longer.
			first := tc.start + int64(time.Minute)
			var s State
			if d := Decide(&s, tc.lim, 2, first); d != under(2, 0, (tc.end-first)/ms) {
				t.Fatalf("first: %+v, want reset in %d ms", d, (tc.end-first)/ms)
			}
			if tc.hours > 24 {
				if d := Decide(&s, tc.lim, 1, tc.start+24*int64(time.Hour)); d.Allowed() {
					t.Fatalf("24 hours after the start, still in the window: %+v", d)
				}
			}
			if d := Decide(&s, tc.lim, 1, tc.end-1); d != over(2, 0, 1, 1) {
				t.Fatalf("1 ns before the end: %+v", d)
			}
			if s.Expires != tc.end {
				t.Fatalf("Expires %v, want %v", time.Unix(0, s.Expires).UTC(), time.Unix(0, tc.end).UTC())
			}
			if d := Decide(&s, tc.lim, 2, tc.end); !d.Allowed() {
				t.Fatalf("at the end: %+v", d)
			}
			// The hit before the start belongs to the previous window.
			var p State
			if d := Decide(&p, tc.lim, 2, tc.start-1); d != under(2, 0, 1) {
				t.Fatalf("1 ns before the start: %+v", d)
			}
		})
	}
}

// In every zone, for every calendar, the window windowAt gives for t
// holds t, starts at the first instant of its first local date (local
// midnight, or the first instant that exists where a change skips
// midnight or a whole day) and ends where the next window starts. The
// zones chosen have changes at midnight (Havana, Santiago, São Paulo
// until 2019), half-hour changes (Lord Howe), a skipped day (Apia,
// 2011-12-30), no changes (Kolkata) and the common case (Berlin, New
// York).
func TestZoneWindowsFollowLocalDates(t *testing.T) {
	t.Parallel()
	zones := []string{"Europe/Berlin", "America/New_York", "America/Havana", "America/Santiago",
		"America/Sao_Paulo", "Australia/Lord_Howe", "Pacific/Apia", "Asia/Kolkata"}
	from, to := at(2010, 1, 1, 0, 0, 0), at(2031, 1, 1, 0, 0, 0)
	const step = int64(3*time.Hour + 7*time.Minute + 11*time.Second)
	for _, name := range zones {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) {
			t.Parallel()
			loc, err := LoadZone(name)
			if err != nil {
				t.Fatal(err)
			}
			date := func(ns int64) time.Time { // the local date of ns, at 00:00 UTC
				y, m, d := time.Unix(0, ns).In(loc).Date()
				return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
			}
			for cal := CalendarDay; cal <= CalendarMonth; cal++ {
				for ts := from; ts < to; ts += step {
					s, e := windowAt(cal, loc, 0, ts)
					if s > ts || e <= ts {
						t.Fatalf("%v at %v: [%v, %v) does not hold it", cal, time.Unix(0, ts).In(loc), time.Unix(0, s).In(loc), time.Unix(0, e).In(loc))
					}
					// The window's first date: t's date, its week's Monday,
					// its month's first.
					first := date(ts)
					switch cal {
					case CalendarWeek:
						first = first.AddDate(0, 0, -((int(first.Weekday()) + 6) % 7))
					case CalendarMonth:
						first = first.AddDate(0, 0, 1-first.Day())
					}
					if date(s).Before(first) || !date(s-1).Before(first) {
						t.Fatalf("%v at %v: starts at %v, not at the first instant of %s", cal, time.Unix(0, ts).In(loc), time.Unix(0, s).In(loc), first.Format(time.DateOnly))
					}
					if ns, ne := windowAt(cal, loc, 0, e); ns != e || ne <= e {
						t.Fatalf("%v at %v: ends at %v, but the next window is [%v, %v)", cal, time.Unix(0, ts).In(loc), time.Unix(0, e).In(loc), time.Unix(0, ns).In(loc), time.Unix(0, ne).In(loc))
					}
				}
			}
		})
	}
}

// A zone's window saturates at the ends of int64 time as UTC's does.
func TestZoneWindowAtTheEndsOfTime(t *testing.T) {
	t.Parallel()
	loc, err := LoadZone("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for cal := CalendarDay; cal <= CalendarMonth; cal++ {
		if s, e := windowAt(cal, loc, 0, math.MaxInt64); e != math.MaxInt64 || s < math.MaxInt64-32*nsPerDay {
			t.Errorf("%v at MaxInt64: [%d, %d)", cal, s, e)
		}
		if s, e := windowAt(cal, loc, 0, 0); s != 0 || e <= 0 {
			t.Errorf("%v at 0: [%d, %d)", cal, s, e)
		}
	}
}

func TestCalendarTZValidation(t *testing.T) {
	t.Parallel()
	base := Limit{Algorithm: FixedWindow, Limit: 5, WindowMS: 86_400_000, Calendar: CalendarDay}
	for _, tc := range []struct{ tz, want string }{
		{"Mars/Olympus_Mons", "not a time zone of the tz database"},
		{"Local", "nodes may not share"},
		{"../../etc/passwd", `byte 0 ('.')`},
		{"Europe/Berlin\x00", "byte 13"},
		{strings.Repeat("A", MaxZoneName+1), "more than 64"},
	} {
		l := base
		l.CalendarTZ = tc.tz
		if err := l.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("calendar_tz %q: %v, want an error containing %q", tc.tz, err, tc.want)
		}
	}
	l := Limit{Algorithm: FixedWindow, Limit: 5, WindowMS: 1000, CalendarTZ: "Europe/Berlin"}
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "applies only to calendar windows") {
		t.Errorf("calendar_tz without a calendar: %v", err)
	}
	for _, tz := range []string{"UTC", "Europe/Berlin", "America/Argentina/ComodRivadavia", "Etc/GMT+5"} {
		l := base
		l.CalendarTZ = tz
		if err := l.Validate(); err != nil {
			t.Errorf("calendar_tz %q: %v", tz, err)
		}
	}
}

// LoadZone accepts only names within its rules, gives the same location
// again from its cache, and every calendar's window in an accepted zone
// holds the instant it was asked for.
func FuzzLoadZone(f *testing.F) {
	for _, s := range []string{"Europe/Berlin", "UTC", "Local", "", "../etc/passwd", "America/Havana", "Etc/GMT+5", "europe/berlin", "Asia/Kolkata\n"} {
		f.Add(s, int64(1_790_000_000_000_000_000))
	}
	f.Fuzz(func(t *testing.T, name string, ts int64) {
		loc, err := LoadZone(name)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if name == "" || name == "Local" || len(name) > MaxZoneName || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_-+") != "" {
			t.Fatalf("accepted %q", name)
		}
		if again, err := LoadZone(name); err != nil || again != loc {
			t.Fatalf("second load of %q: %v, %v", name, again, err)
		}
		ts = max(ts, 0)
		for cal := CalendarDay; cal <= CalendarMonth; cal++ {
			if s, e := windowAt(cal, loc, 0, ts); s > ts || e <= ts && e != math.MaxInt64 {
				t.Fatalf("%v in %q at %d: [%d, %d)", cal, name, ts, s, e)
			}
		}
	})
}
