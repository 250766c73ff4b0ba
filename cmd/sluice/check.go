package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/client"
	"github.com/sluicehq/sluice/cluster/check"
	sluicev1 "github.com/sluicehq/sluice/proto/sluice/v1"
	"github.com/sluicehq/sluice/transport/peer"
)

// jsonOut prints protobuf messages as docs/architecture.md §4 asks: proto field names,
// every field present.
var jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// Exit codes of `sluice check`.
const (
	exitAllowed = 0
	exitOver    = 1
	exitError   = 2
)

func checkCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of any node")
	var cf checkFlags
	cf.register(fs)
	asJSON := fs.Bool("json", false, "print the response as protobuf JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the call")
	reserveTTL := fs.Duration("reserve-ttl", 0, "reserve: --hits is an estimate; an admitted answer carries a reservation id to settle within this long (at most 1h)")
	settle := fs.String("settle", "", "settle this reservation id at --actual hits (--hits is then 0; give the key and limit as the reserving check did)")
	actual := fs.Int64("actual", 0, "with --settle: the actual cost")
	var sec clientFlags
	sec.register(fs, false)
	if code, ok := parseCommand(fs, args, exitAllowed); !ok {
		return code
	}
	fail := func(format string, a ...any) int { return checkFail(stderr, format, a...) }
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	req, err := cf.request(set)
	if err != nil {
		return fail("%v", err)
	}
	if *reserveTTL%time.Millisecond != 0 {
		return fail("--reserve-ttl %v: must be a whole number of milliseconds", *reserveTTL)
	}
	req.ReserveTtlMs = reserveTTL.Milliseconds()
	if *settle != "" {
		req.ReservationId, req.Actual = *settle, *actual
		if !set["hits"] {
			req.Hits = proto.Int64(0)
		}
	} else if set["actual"] {
		return fail("--actual goes with --settle")
	}
	opts, err := sec.dialOptions()
	if err != nil {
		return fail("%v", err)
	}
	c, err := client.Dial(*addr, opts...)
	if err != nil {
		return fail("%s: %v", *addr, err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	resp, err := c.Check(cctx, &sluicev1.CheckRequest{Requests: []*sluicev1.RateLimitRequest{req}})
	if err != nil {
		return fail("%s: %v", *addr, err)
	}
	if len(resp.Responses) != 1 {
		return fail("%s answered %d responses to 1 request", *addr, len(resp.Responses))
	}
	return printCheck(stdout, stderr, resp.Responses[0], *asJSON, *addr)
}

// checkFail prints an error of `sluice check` and returns its exit code.
func checkFail(stderr io.Writer, format string, a ...any) int {
	fmt.Fprintf(stderr, "sluice check: "+format+"\n", a...)
	return exitError
}

// checkFlags are the flags of `sluice check` that make its request.
type checkFlags struct {
	name, key                                string
	limit, hits, burst, subWindows           int64
	window                                   time.Duration
	algorithm, mode, calendar, calendarTZ    string
	shaping, countRefused                    bool
	softPercent, elasticCeiling, elasticLoad int64
	specs                                    []string // --also, one each
}

func (cf *checkFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&cf.name, "name", "", "the limit's namespace, e.g. api.create_url")
	fs.StringVar(&cf.key, "key", "", "the entity, e.g. user:42")
	fs.Int64Var(&cf.limit, "limit", 0, "hits allowed per window (0: the rule for --name, or only the --also limits)")
	fs.DurationVar(&cf.window, "window", 0, "window length, e.g. 1m or 24h (may be omitted with --calendar)")
	fs.Int64Var(&cf.hits, "hits", 1, "cost of this request; 0 peeks")
	fs.Int64Var(&cf.burst, "burst", 0, "bucket capacity for token/leaky bucket and gcra (0: limit)")
	fs.StringVar(&cf.algorithm, "algorithm", "sliding_window", "sliding_window|sliding_log|token_bucket|leaky_bucket|fixed_window|gcra (fixed_window by default with --calendar)")
	fs.Int64Var(&cf.subWindows, "sub-windows", 0, "sliding_window only: count the window in N sub-windows (2..1000)")
	fs.BoolVar(&cf.shaping, "shaping", false, "leaky_bucket only: admit with a delay (retry_after_ms) while the queue has room")
	fs.StringVar(&cf.mode, "mode", "hard", "hard|soft|elastic")
	fs.Int64Var(&cf.softPercent, "soft-percent", 0, "mode soft: admit up to P percent over the limit (1..1000)")
	fs.Int64Var(&cf.elasticCeiling, "elastic-ceiling", 0, "mode elastic: the limit while the node's load is below --elastic-load-percent")
	fs.Int64Var(&cf.elasticLoad, "elastic-load-percent", 0, "mode elastic: load, in percent of the node's CPU capacity (1..100)")
	fs.BoolVar(&cf.countRefused, "count-refused", false, "refused hits consume too")
	fs.StringVar(&cf.calendar, "calendar", "", "day|week|month: fixed_window windows on calendar edges, in UTC or --calendar-tz")
	fs.StringVar(&cf.calendarTZ, "calendar-tz", "", "with --calendar: the IANA time zone of the calendar, e.g. Europe/Berlin (default UTC)")
	fs.Func("also", "another limit on the same key, decided atomically with the others, e.g. \"limit=10,window=1m[,algorithm=gcra,burst=5]\"; keys: "+strings.Join(specKeys, ", ")+" (repeatable)", func(spec string) error {
		cf.specs = append(cf.specs, spec)
		return nil
	})
}

// request is the check the flags ask for; set holds the names of the
// flags given. The error says which flag is wrong.
func (cf *checkFlags) request(set map[string]bool) (*sluicev1.RateLimitRequest, error) {
	var more []bucket.Limit
	for _, spec := range cf.specs {
		l, err := parseLimitSpec(spec)
		if err != nil {
			return nil, fmt.Errorf("--also %q: %v", spec, err)
		}
		more = append(more, l)
	}
	alg, err := bucket.ParseAlgorithm(cf.algorithm)
	if err != nil {
		return nil, fmt.Errorf("--algorithm: %v", err)
	}
	m, err := bucket.ParseMode(cf.mode)
	if err != nil {
		return nil, fmt.Errorf("--mode: %v", err)
	}
	cal, err := bucket.ParseCalendar(cf.calendar)
	if err != nil {
		return nil, fmt.Errorf("--calendar: %v", err)
	}
	window := cf.window
	if window < 0 || window%time.Millisecond != 0 {
		return nil, fmt.Errorf("--window %v: must be a positive whole number of milliseconds", window)
	}
	if cal != bucket.CalendarNone {
		if !set["algorithm"] {
			alg = bucket.FixedWindow
		}
		if window == 0 {
			window = calendarWindow(cal)
		}
	}
	inline := bucket.Limit{
		Algorithm: alg, Limit: cf.limit, WindowMS: window.Milliseconds(), Burst: cf.burst,
		SubWindows: cf.subWindows, Shaping: cf.shaping, Mode: m, SoftPercent: cf.softPercent,
		ElasticCeiling: cf.elasticCeiling, ElasticLoadPercent: cf.elasticLoad,
		CountRefused: cf.countRefused, Calendar: cal, CalendarTZ: cf.calendarTZ,
	}
	if cf.limit == 0 && len(more) > 0 {
		// Only the --also limits: the inline limit must be all unset.
		for _, f := range inlineFlags {
			if set[f] {
				return nil, fmt.Errorf("--%s applies to the inline limit, which --also without --limit leaves out: put it in the --also spec, or give --limit", f)
			}
		}
		inline = bucket.Limit{}
	}
	return peer.RequestToProto(check.Request{Name: cf.name, Key: cf.key, Hits: cf.hits, Limit: inline, More: more}), nil
}

// printCheck prints the answer r of the node at addr, as JSON or for a
// reader, and returns the exit code it means.
func printCheck(stdout, stderr io.Writer, r *sluicev1.RateLimitResponse, asJSON bool, addr string) int {
	if asJSON {
		b, err := jsonOut.Marshal(r)
		if err != nil {
			return checkFail(stderr, "%v", err)
		}
		fmt.Fprintln(stdout, string(b))
	}
	switch {
	case r.Error != "":
		if !asJSON {
			fmt.Fprintf(stderr, "sluice check: error: %s\n", r.Error)
		}
		return exitError
	case r.Status == sluicev1.Status_STATUS_UNDER_LIMIT:
		if !asJSON {
			fmt.Fprintf(stdout, "allowed: %d of %d remaining, full again in %s (decided by %s)\n",
				r.Remaining, r.Limit, ms(r.ResetAfterMs), r.Owner)
			printReservation(stdout, r)
		}
		return exitAllowed
	case r.Status == sluicev1.Status_STATUS_OVER_LIMIT:
		if !asJSON {
			fmt.Fprintf(stdout, "over limit: %d of %d remaining, retry in %s (decided by %s)\n",
				r.Remaining, r.Limit, ms(r.RetryAfterMs), r.Owner)
			printReservation(stdout, r)
		}
		return exitOver
	}
	return checkFail(stderr, "%s answered status %v", addr, r.Status)
}

// printReservation prints what a reserve or a settle answered.
func printReservation(stdout io.Writer, r *sluicev1.RateLimitResponse) {
	if r.ReservationId != nil {
		fmt.Fprintf(stdout, "reservation: %s\n", r.GetReservationId())
	}
	if r.Returned != nil || r.Charged != nil {
		fmt.Fprintf(stdout, "settled: %d returned, %d charged\n", r.GetReturned(), r.GetCharged())
	}
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// inlineFlags are the flags of the inline limit other than --limit.
var inlineFlags = []string{"window", "burst", "algorithm", "sub-windows", "shaping", "mode", "soft-percent",
	"elastic-ceiling", "elastic-load-percent", "count-refused", "calendar", "calendar-tz"}

// specKeys are the keys of an --also spec.
var specKeys = []string{"limit", "window", "algorithm", "burst", "sub_windows", "shaping", "mode", "soft_percent",
	"elastic_ceiling", "elastic_load_percent", "count_refused", "calendar", "calendar_tz"}

// calendarWindow is the window sent with a calendar limit whose window was
// omitted: the calendar's nominal length (the server uses the calendar's
// edges; the window only has to be valid).
func calendarWindow(c bucket.Calendar) time.Duration {
	switch c {
	case bucket.CalendarWeek:
		return 7 * 24 * time.Hour
	case bucket.CalendarMonth:
		return 31 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// parseLimitSpec parses an --also spec: comma-separated key=value pairs, the
// keys of specKeys ("-" may stand for "_"), each at most once. limit is
// required; window (a Go duration, e.g. 1m) too unless calendar is given;
// shaping and count_refused may stand alone for "=true". Like the inline
// flags, algorithm defaults to sliding_window, or fixed_window with a
// calendar. The limit is checked with bucket.Limit.Validate.
func parseLimitSpec(spec string) (bucket.Limit, error) {
	l := bucket.Limit{Algorithm: bucket.SlidingWindow}
	seen := map[string]bool{}
	var window time.Duration
	for part := range strings.SplitSeq(spec, ",") {
		part = strings.TrimSpace(part)
		k, v, hasValue := strings.Cut(part, "=")
		k = strings.ReplaceAll(strings.TrimSpace(k), "-", "_")
		v = strings.TrimSpace(v)
		if k == "" {
			return l, fmt.Errorf("empty item in %q: want key=value pairs separated by commas", spec)
		}
		if seen[k] {
			return l, fmt.Errorf("%s given twice", k)
		}
		seen[k] = true
		if !hasValue && k != "shaping" && k != "count_refused" {
			if slices.Contains(specKeys, k) {
				return l, fmt.Errorf("%s needs a value (%s=...)", k, k)
			}
			return l, fmt.Errorf("unknown key %q (want %s)", k, strings.Join(specKeys, ", "))
		}
		var err error
		switch k {
		case "limit":
			l.Limit, err = parseSpecInt(v)
		case "window":
			window, err = time.ParseDuration(v)
			if err == nil && (window <= 0 || window%time.Millisecond != 0) {
				err = errors.New("must be a positive whole number of milliseconds, e.g. 500ms, 1m, 24h")
			}
		case "algorithm":
			l.Algorithm, err = bucket.ParseAlgorithm(v)
		case "burst":
			l.Burst, err = parseSpecInt(v)
		case "sub_windows":
			l.SubWindows, err = parseSpecInt(v)
		case "shaping":
			l.Shaping, err = parseSpecBool(v, hasValue)
		case "mode":
			l.Mode, err = bucket.ParseMode(v)
		case "soft_percent":
			l.SoftPercent, err = parseSpecInt(v)
		case "elastic_ceiling":
			l.ElasticCeiling, err = parseSpecInt(v)
		case "elastic_load_percent":
			l.ElasticLoadPercent, err = parseSpecInt(v)
		case "count_refused":
			l.CountRefused, err = parseSpecBool(v, hasValue)
		case "calendar":
			l.Calendar, err = bucket.ParseCalendar(v)
		case "calendar_tz":
			if _, err = bucket.LoadZone(v); err == nil {
				l.CalendarTZ = v
			}
		default:
			return l, fmt.Errorf("unknown key %q (want %s)", k, strings.Join(specKeys, ", "))
		}
		if err != nil {
			return l, fmt.Errorf("%s=%q: %v", k, v, err)
		}
	}
	if !seen["limit"] {
		return l, errors.New("limit is missing (e.g. limit=10,window=1m)")
	}
	if l.Calendar != bucket.CalendarNone {
		if !seen["algorithm"] {
			l.Algorithm = bucket.FixedWindow
		}
		if !seen["window"] {
			window = calendarWindow(l.Calendar)
		}
	} else if !seen["window"] {
		return l, errors.New("window is missing (e.g. window=1m), or give a calendar")
	}
	l.WindowMS = window.Milliseconds()
	if err := l.Validate(); err != nil {
		return l, err
	}
	return l, nil
}

func parseSpecInt(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange):
		return 0, errors.New("out of range")
	case err != nil:
		return 0, errors.New("want a whole number")
	}
	return n, nil
}

func parseSpecBool(v string, hasValue bool) (bool, error) {
	if !hasValue {
		return true, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errors.New("want true or false")
	}
	return b, nil
}
