package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"google.golang.org/protobuf/proto"
)

// resetBounds returns the reset_after_ms an answer given between before
// and after must carry for a calendar day in loc: the time from the answer
// to the next local midnight, rounded up to a millisecond, so within
// [ceil(midnight − after), ceil(midnight − before)]. ok is false when the
// two instants fall on different local days (the call straddled midnight).
func resetBounds(loc *time.Location, before, after time.Time) (lo, hi int64, ok bool) {
	next := func(t time.Time) time.Time {
		y, m, d := t.In(loc).Date()
		return time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	}
	mid := next(before)
	if !next(after).Equal(mid) {
		return 0, 0, false
	}
	ceilMS := func(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }
	return ceilMS(mid.Sub(after)), ceilMS(mid.Sub(before)), true
}

// TestCalendarInAZoneAcrossThreeNodes: calendar days in named time zones,
// from a rules file and inline (gRPC, HTTP and the CLI), on three real
// nodes. The count is the cluster's, whichever node is asked; each answer's
// reset_after_ms runs to the zone's next local midnight; an unknown zone
// is refused with an error naming it while the nodes keep serving; and
// once the key's owner is SIGKILLed the survivors still refuse the key,
// whose count its replica holds.
func TestCalendarInAZoneAcrossThreeNodes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	replace(t, path, "rules:\n  - name: daily\n    limits:\n      - {limit: 2, calendar: day, calendar_tz: Pacific/Kiritimati}\n")
	ps := startClusterAt(t, "127.0.0.31", 3, "--rules", path)
	clients := clientsOf(t, ps)

	// check asks node i and verifies the reset against zone's midnight.
	check := func(i int, zone string, req *sluicev1.RateLimitRequest) *sluicev1.RateLimitResponse {
		t.Helper()
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			before := time.Now()
			resp, err := clients[i].Check(ctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{req}})
			after := time.Now()
			cancel()
			if err != nil {
				t.Fatalf("check on %s: %v", ps[i].name, err)
			}
			r := resp.Responses[0]
			if r.Error != "" {
				t.Fatalf("check on %s: %s", ps[i].name, r.Error)
			}
			lo, hi, ok := resetBounds(loc, before, after)
			if !ok {
				continue // across local midnight: ask again in the new day
			}
			if r.ResetAfterMs < lo || r.ResetAfterMs > hi {
				t.Fatalf("check on %s in %s: reset_after_ms %d, want %d..%d (the next local midnight, %v)",
					ps[i].name, zone, r.ResetAfterMs, lo, hi, time.Duration(hi)*time.Millisecond)
			}
			t.Logf("%s in %s on %s: %v, %d remaining, reset in %v (bounds %d..%d ms)", req.Name, zone, ps[i].name,
				r.Status, r.Remaining, time.Duration(r.ResetAfterMs)*time.Millisecond, lo, hi)
			return r
		}
	}
	under, over := sluicev1.Status_STATUS_UNDER_LIMIT, sluicev1.Status_STATUS_OVER_LIMIT

	// The rule: 2 a day in Kiritimati (UTC+14), shared by the nodes.
	rule := &sluicev1.RateLimitRequest{Name: "daily", Key: "k"}
	var owner string
	for i, want := range []sluicev1.Status{under, under, over} {
		r := check(i, "Pacific/Kiritimati", rule)
		if r.Status != want {
			t.Fatalf("rule check %d on %s: %v, want %v", i, ps[i].name, r.Status, want)
		}
		owner = r.Owner
	}

	// Inline over gRPC, in New York.
	inline := &sluicev1.RateLimitRequest{Name: "inline", Key: "k", Hits: proto.Int64(1), Limit: 1, WindowMs: 86_400_000,
		Algorithm: sluicev1.Algorithm_ALGORITHM_FIXED_WINDOW, Calendar: sluicev1.Calendar_CALENDAR_DAY, CalendarTz: "America/New_York"}
	if r := check(1, "America/New_York", inline); r.Status != under {
		t.Fatalf("inline: %v", r.Status)
	}
	if r := check(2, "America/New_York", inline); r.Status != over {
		t.Fatalf("inline, second: %v", r.Status)
	}

	// Over HTTP, in Tokyo, and a zone that does not exist.
	post := func(i int, body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+ps[i].http+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tokyo := `{"requests":[{"name":"http","key":"k","limit":1,"window_ms":86400000,"algorithm":"fixed_window","calendar":"day","calendar_tz":"Asia/Tokyo"}]}`
	loc, _ := time.LoadLocation("Asia/Tokyo")
	before := time.Now()
	code, body := post(0, tokyo)
	after := time.Now()
	var answer struct {
		Responses []struct {
			Status       string `json:"status"`
			ResetAfterMS string `json:"reset_after_ms"`
			Error        string `json:"error"`
		} `json:"responses"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || code != http.StatusOK || len(answer.Responses) != 1 {
		t.Fatalf("HTTP in Tokyo: %d %s (%v)", code, body, err)
	}
	if lo, hi, ok := resetBounds(loc, before, after); ok {
		if a := answer.Responses[0]; a.Status != "STATUS_UNDER_LIMIT" || !inRange(a.ResetAfterMS, lo, hi) {
			t.Fatalf("HTTP in Tokyo: %s, want allowed with reset_after_ms in %d..%d", body, lo, hi)
		}
	}
	if code, body := post(1, tokyo); !strings.Contains(body, "STATUS_OVER_LIMIT") {
		t.Fatalf("HTTP in Tokyo, second: %d %s", code, body)
	}
	bad := strings.Replace(tokyo, "Asia/Tokyo", "Mars/Olympus", 1)
	if _, body := post(2, bad); !strings.Contains(body, `calendar_tz \"Mars/Olympus\": not a time zone`) {
		t.Fatalf("HTTP with an unknown zone: %s, want an error naming calendar_tz", body)
	}

	// The CLI, in Tokyo too.
	for i, want := range []int{0, 1} {
		out, got := runCLI(t, "check", "--addr", ps[i].grpc, "--name", "cli", "--key", "k", "--limit", "1",
			"--calendar", "day", "--calendar-tz", "Asia/Tokyo")
		if got != want {
			t.Fatalf("sluice check %d exited %d, want %d: %s", i, got, want, out)
		}
	}
	if out, got := runCLI(t, "check", "--addr", ps[0].grpc, "--name", "cli", "--key", "k2", "--limit", "1",
		"--calendar", "day", "--calendar-tz", "Local"); got != 2 || !strings.Contains(out, "calendar_tz") {
		t.Fatalf("sluice check with calendar_tz Local exited %d, want 2 and an error naming calendar_tz: %s", got, out)
	}

	// The rule's owner dies once its count is replicated and on disk: the
	// survivors still refuse the key.
	waitSettled(t, clients)
	victim := -1
	for i, p := range ps {
		if p.name == owner {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("owner %q is not one of the nodes", owner)
	}
	if err := ps[victim].stop(t, syscall.SIGKILL, 10*time.Second); err == nil {
		t.Fatal("SIGKILL: process exited cleanly")
	}
	for i := range ps {
		if i == victim {
			continue
		}
		if r := check(i, "Pacific/Kiritimati", rule); r.Status != over {
			t.Fatalf("after the owner %s was killed, %s answered %v, want over: the count was lost", owner, ps[i].name, r.Status)
		}
	}
}

// inRange reports whether the decimal string s is a number in lo..hi.
func inRange(s string, lo, hi int64) bool {
	var v int64
	if _, err := fmt.Sscan(s, &v); err != nil {
		return false
	}
	return lo <= v && v <= hi
}
