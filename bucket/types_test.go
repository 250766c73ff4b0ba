package bucket

import (
	"strings"
	"testing"
)

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
