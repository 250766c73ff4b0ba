// Command envoydiff sends the same Envoy rate limit requests to a reference
// rate limit service (envoyproxy/ratelimit) and to a Sluice cluster, and
// compares the answers one by one: the overall code, and for each descriptor
// its code, current_limit, limit_remaining and duration_until_reset (to
// within two seconds: envoyproxy/ratelimit gives whole seconds).
//
// Both must have loaded test/envoydiff/diff.yaml with fresh counters. The
// requests to Sluice go to its nodes in turn. docs/envoy.md records a run.
//
//	go run ./test/envoydiff -ref 127.0.0.1:8081 -sluice host:port,host:port,host:port
//
// It exits 1 when an answer differs in a way not marked as a deliberate
// difference, 2 on a usage or connection error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// step is one request. deliberate, when set, names the deliberate
// difference of docs/envoy.md this request is expected to show.
type step struct {
	req        *rlsv3.RateLimitRequest
	deliberate string
}

// sequence is a named run of requests; align says which window edge it must
// not cross ("second" or "minute"; every sequence stays inside one hour).
type sequence struct {
	name  string
	align string
	steps []step
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func override(d *rlcommon.RateLimitDescriptor, rpu uint32, unit typev3.RateLimitUnit, mult uint32) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: unit}
	if mult > 0 {
		d.Limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	return d
}

func call(domain string, hitsAddend uint32, ds ...*rlcommon.RateLimitDescriptor) step {
	return step{req: &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hitsAddend, Descriptors: ds}}
}

func repeat(n int, s func() step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s()
	}
	return out
}

func (s step) expect(why string) step {
	s.deliberate = why
	return s
}

const (
	peek      = "a peek (descriptor hits_addend 0) at a counter exactly at its limit: OVER_LIMIT here, OK there"
	keyValue  = "wildcards match the value here, the string key_value there"
	unitMult  = "unit_multiplier of a limit override is applied here, ignored there"
	invalid   = "a request Sluice refuses with INVALID_ARGUMENT"
	negative  = "is_negative_hits: INVALID_ARGUMENT here, ignored there"
	saturated = "refused hits saturate at the limit here; INCRBY adds them all there"
	noCounter = "requests_per_unit 0 is answered without a counter here; INCRBY counts the hits there"
)

// One table of sequences; long on purpose: each sequence reads alone.
func sequences() []sequence {
	d := "diff"
	one := func(kv ...string) func() step { return func() step { return call(d, 0, desc(kv...)) } }
	seqs := []sequence{
		{name: "exact match, exhausted past its limit", steps: repeat(5, one("exact", "a"))},
		{name: "key only: each value its own counter", steps: append(repeat(3, one("exact", "b")), repeat(3, one("exact", "c"))...)},
		{name: "entry with an empty value falls back to the key", steps: repeat(3, one("exact", ""))},
		{name: "wildcard: each value its own counter; exact beats wildcard", steps: concat(
			repeat(3, one("wild", "pre")), repeat(3, one("wild", "prefix")),
			repeat(5, one("wild", "prefix-exact")), repeat(2, one("wild", "xAyBz")),
			repeat(2, one("wild", "xyz")), repeat(2, one("wild", "nomatch")))},
		{name: "share_threshold: one counter for all values", steps: []step{
			call(d, 0, desc("shared", "s1")), call(d, 0, desc("shared", "s2")), call(d, 0, desc("shared", "s3")),
			call(d, 0, desc("shared", "s4")), call(d, 0, desc("shared", "s")),
		}},
		{name: "wildcard pattern against key_value", steps: []step{
			call(d, 0, desc("a", "b_c1")), call(d, 0, desc("a", "b_c1")),
			call(d, 0, desc("a_b", "c1")).expect(keyValue),
		}},
		{name: "nested", steps: concat(
			repeat(3, one("outer", "o", "inner", "x")),
			repeat(2, one("outer", "o", "inner", "vip")),
			repeat(2, one("outer", "o", "mid", "m", "leaf", "l")),
			repeat(6, one("outer", "o2")),
			repeat(2, one("outer", "o2", "inner", "x")),
			repeat(1, one("outer", "o")),
			repeat(1, one("outer", "o", "mid", "m")),
		)},
		{name: "unlimited", steps: repeat(3, one("unl", "1"))},
		{name: "shadow_mode", steps: repeat(3, one("shadow", "1"))},
		{name: "requests_per_unit 0", steps: []step{
			call(d, 0, hits(desc("zero", "0"), 0)).expect(peek),
			call(d, 0, desc("zero", "1")), call(d, 0, desc("zero", "1")), call(d, 5, desc("zero", "1")),
			call(d, 0, hits(desc("zero", "1"), 0)),
			call(d, 0, override(desc("zero", "1"), 10, typev3.RateLimitUnit_HOUR, 0)).expect(noCounter),
		}},
		{name: "replaces", steps: []step{
			call(d, 0, desc("rep_a", "1")), call(d, 0, desc("rep_a", "1")),
			call(d, 0, desc("rep_a", "1"), desc("rep_b", "1")),
			call(d, 0, desc("rep_b", "1"), desc("rep_a", "1")),
			call(d, 0, desc("rep_u", "1"), desc("rep_a", "1")),
			call(d, 0, desc("rep_a", "2"), desc("rep_u", "1")),
			call(d, 0, desc("rep_a", "2")),
		}},
		{name: "request hits_addend", steps: []step{
			call(d, 3, desc("hits", "r")), call(d, 0, desc("hits", "r")), call(d, 1, desc("hits", "r")),
			call(d, 5, desc("hits", "r")), call(d, 1, desc("hits", "r")), call(d, 1, desc("hits", "r")),
			call(d, 11, desc("hits", "big")), call(d, 1, desc("hits", "big")),
		}},
		{name: "descriptor hits_addend", steps: []step{
			call(d, 1, hits(desc("hits", "d"), 4)),
			call(d, 7, hits(desc("hits", "d"), 0)),
			call(d, 0, hits(desc("hits", "d"), 5)),
			call(d, 0, hits(desc("hits", "d"), 1)),
			call(d, 0, hits(desc("hits", "d"), 0)).expect(peek),
			call(d, 0, hits(desc("hits", "d"), 1)),
			call(d, 0, hits(desc("hits", "d"), 0)),
			call(d, 3, hits(desc("hits", "e"), 2), desc("hits", "e"), hits(desc("hits", "e"), 0), desc("hits", "f")),
		}},
		{name: "limit override", align: "minute", steps: concat(
			repeat(3, func() step { return call(d, 0, override(desc("ovr", "x"), 2, typev3.RateLimitUnit_HOUR, 0)) }),
			[]step{call(d, 0, desc("ovr", "x")).expect(saturated)},
			repeat(3, func() step { return call(d, 0, override(desc("norule", "y"), 2, typev3.RateLimitUnit_DAY, 0)) }),
			repeat(2, func() step { return call(d, 0, override(desc("free", "z"), 1, typev3.RateLimitUnit_MINUTE, 0)) }),
			[]step{
				call(d, 0, override(desc("ovr", "m"), 5, typev3.RateLimitUnit_MINUTE, 2)).expect(unitMult),
				call("nope", 0, override(desc("ovr", "u"), 1, typev3.RateLimitUnit_HOUR, 0)),
				call("nope", 0, override(desc("ovr", "u"), 1, typev3.RateLimitUnit_HOUR, 0)),
			},
		)},
		{name: "unknown domain, no match", steps: []step{
			call("nope", 0, desc("exact", "a")), call(d, 0, desc("unknown", "1")),
			call(d, 0, desc("exact", "a", "more", "1")), call(d, 0, desc("norule", "1")),
		}},
		{name: "multiple descriptors: overall code", steps: concat(
			repeat(3, func() step {
				return call(d, 0, desc("exact", "m"), desc("shadow", "m"), desc("unl", "m"), desc("unknown", "m"))
			}),
			repeat(2, func() step { return call(d, 0, desc("shadow", "n"), desc("exact", "n")) }),
			repeat(3, func() step { return call(d, 0, desc("exact", "dup"), desc("exact", "dup"), desc("exact", "dup")) }),
		)},
		{name: "quota_mode", steps: concat(
			repeat(4, func() step { return call(d, 0, desc("quota", "q"), desc("quota2", "q")) }),
			repeat(2, func() step { return call(d, 0, desc("quota", "r"), desc("exact", "r")) }),
			repeat(2, func() step { return call(d, 0, desc("quota", "s"), desc("quota", "s")) }),
		)},
		{name: "units: week, month, year", steps: concat(
			repeat(3, one("wk", "1")), repeat(3, one("mon", "1")), repeat(3, one("yr", "1")))},
		{name: "unit minute", align: "minute", steps: repeat(3, one("min", "1"))},
		{name: "unit second", align: "second", steps: repeat(3, one("sec", "1"))},
		{name: "invalid requests", steps: []step{
			call("", 0, desc("exact", "a")), // both refuse: Unknown there, InvalidArgument here
			call(d, 0),
			call(d, 0, desc()).expect(invalid),
			call(d, 0, desc("", "v")).expect(invalid),
			{req: &rlsv3.RateLimitRequest{Domain: d, Descriptors: []*rlcommon.RateLimitDescriptor{{
				Entries: desc("hits", "neg").Entries, HitsAddend: wrapperspb.UInt64(1), IsNegativeHits: true}}},
				deliberate: negative},
			call(d, 0, desc("hits", "neg")).expect(negative + " (so there the previous request counted)"),
		}},
	}
	return seqs
}

func concat(parts ...[]step) []step {
	var out []step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// waitFor returns when a sequence aligned to unit can run without crossing
// its window's edge; every sequence must also stay inside one hour.
func waitFor(unit string) {
	for {
		now := time.Now()
		var room time.Duration
		switch unit {
		case "second":
			room = time.Second - now.Sub(now.Truncate(time.Second))
			if room > 800*time.Millisecond {
				return
			}
		case "minute":
			room = time.Minute - now.Sub(now.Truncate(time.Minute))
			if room > 10*time.Second {
				return
			}
		default:
			room = time.Hour - now.Sub(now.Truncate(time.Hour))
			if room > 2*time.Minute {
				return
			}
		}
		time.Sleep(room + 20*time.Millisecond)
	}
}

// compare returns the differences between two answers.
func compare(a, b *rlsv3.RateLimitResponse, aerr, berr error) []string {
	if aerr != nil || berr != nil {
		if aerr != nil && berr != nil {
			return nil
		}
		return []string{fmt.Sprintf("error: ref %v, sluice %v", aerr, berr)}
	}
	var diffs []string
	if a.GetOverallCode() != b.GetOverallCode() {
		diffs = append(diffs, fmt.Sprintf("overall_code: ref %v, sluice %v", a.GetOverallCode(), b.GetOverallCode()))
	}
	if len(a.GetStatuses()) != len(b.GetStatuses()) {
		return append(diffs, fmt.Sprintf("%d statuses from ref, %d from sluice", len(a.GetStatuses()), len(b.GetStatuses())))
	}
	for i := range a.GetStatuses() {
		x, y := a.Statuses[i], b.Statuses[i]
		if x.GetCode() != y.GetCode() {
			diffs = append(diffs, fmt.Sprintf("[%d] code: ref %v, sluice %v", i, x.GetCode(), y.GetCode()))
		}
		if fx, fy := limitText(x.GetCurrentLimit()), limitText(y.GetCurrentLimit()); fx != fy {
			diffs = append(diffs, fmt.Sprintf("[%d] current_limit: ref %s, sluice %s", i, fx, fy))
		}
		if x.GetLimitRemaining() != y.GetLimitRemaining() {
			diffs = append(diffs, fmt.Sprintf("[%d] limit_remaining: ref %d, sluice %d", i, x.GetLimitRemaining(), y.GetLimitRemaining()))
		}
		rx, ry := x.GetDurationUntilReset(), y.GetDurationUntilReset()
		switch {
		case (rx == nil) != (ry == nil):
			diffs = append(diffs, fmt.Sprintf("[%d] duration_until_reset: ref %v, sluice %v", i, rx.AsDuration(), ry.AsDuration()))
		case rx != nil:
			if d := rx.AsDuration() - ry.AsDuration(); d > 2*time.Second || d < -2*time.Second {
				diffs = append(diffs, fmt.Sprintf("[%d] duration_until_reset: ref %v, sluice %v", i, rx.AsDuration(), ry.AsDuration()))
			}
		}
	}
	return diffs
}

func limitText(l *rlsv3.RateLimitResponse_RateLimit) string {
	if l == nil {
		return "none"
	}
	s := fmt.Sprintf("%d/%v", l.GetRequestsPerUnit(), l.GetUnit())
	if l.GetName() != "" {
		s += " name=" + l.GetName()
	}
	if m := l.GetUnitMultiplier(); m != nil {
		s += fmt.Sprintf(" ×%d", m.GetValue())
	}
	return s
}

func answerText(r *rlsv3.RateLimitResponse, err error) string {
	if err != nil {
		return "error " + status.Code(err).String()
	}
	parts := []string{r.GetOverallCode().String()}
	for _, s := range r.GetStatuses() {
		p := fmt.Sprintf("%v rem=%d limit=%s", s.GetCode(), s.GetLimitRemaining(), limitText(s.GetCurrentLimit()))
		if s.GetDurationUntilReset() != nil {
			p += fmt.Sprintf(" reset=%v", s.GetDurationUntilReset().AsDuration().Round(time.Second))
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " | ")
}

func reqText(r *rlsv3.RateLimitRequest) string {
	var ds []string
	for _, d := range r.GetDescriptors() {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
		}
		s := "{" + strings.Join(es, ",") + "}"
		if h := d.GetHitsAddend(); h != nil {
			s += fmt.Sprintf("+%d", h.GetValue())
		}
		if l := d.GetLimit(); l != nil {
			s += fmt.Sprintf(" limit %d/%v×%d", l.GetRequestsPerUnit(), l.GetUnit(), l.GetUnitMultiplier().GetValue())
		}
		if d.GetIsNegativeHits() {
			s += " negative"
		}
		ds = append(ds, s)
	}
	return fmt.Sprintf("%q hits=%d %s", r.GetDomain(), r.GetHitsAddend(), strings.Join(ds, " "))
}

func main() {
	ref := flag.String("ref", "", "gRPC address of the reference service (envoyproxy/ratelimit)")
	nodes := flag.String("sluice", "", "comma-separated gRPC addresses of the Sluice nodes")
	verbose := flag.Bool("v", false, "print every request and both answers")
	flag.Parse()
	if *ref == "" || *nodes == "" {
		fmt.Fprintln(os.Stderr, "usage: envoydiff -ref ADDR -sluice ADDR[,ADDR...]")
		os.Exit(2)
	}
	dial := func(addr string) rlsv3.RateLimitServiceClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	refc := dial(*ref)
	var sl []rlsv3.RateLimitServiceClient
	for _, a := range strings.Split(*nodes, ",") {
		sl = append(sl, dial(a))
	}

	var total, matched, expected, unexpected, unmarkedSame int
	n := 0
	for _, seq := range sequences() {
		waitFor("hour")
		if seq.align != "" {
			waitFor(seq.align)
		}
		fmt.Printf("== %s\n", seq.name)
		for _, st := range seq.steps {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			a, aerr := refc.ShouldRateLimit(ctx, st.req)
			b, berr := sl[n%len(sl)].ShouldRateLimit(ctx, st.req)
			cancel()
			n++
			total++
			diffs := compare(a, b, aerr, berr)
			switch {
			case len(diffs) == 0 && st.deliberate == "":
				matched++
			case len(diffs) == 0:
				matched++
				unmarkedSame++
				fmt.Printf("  same, though marked deliberate (%s): %s\n", st.deliberate, reqText(st.req))
			case st.deliberate != "":
				expected++
			default:
				unexpected++
			}
			if *verbose || len(diffs) > 0 || aerr != nil || berr != nil {
				tag := "  "
				if len(diffs) > 0 {
					tag = "≠ "
					if st.deliberate != "" {
						tag = "~ "
					}
				}
				fmt.Printf("%s%s\n      ref:    %s\n      sluice: %s\n", tag, reqText(st.req), answerText(a, aerr), answerText(b, berr))
				for _, d := range diffs {
					fmt.Printf("      %s\n", d)
				}
				if len(diffs) > 0 && st.deliberate != "" {
					fmt.Printf("      deliberate: %s\n", st.deliberate)
				}
			}
		}
	}
	fmt.Printf("\n%d requests: %d answers the same, %d differ as documented, %d differ otherwise", total, matched, expected, unexpected)
	if unmarkedSame > 0 {
		fmt.Printf(" (%d marked deliberate answered the same)", unmarkedSame)
	}
	fmt.Println()
	if unexpected > 0 {
		os.Exit(1)
	}
}
