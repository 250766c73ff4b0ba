package clustertest

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A scenario is a few lines, one step each; blank lines and lines from #
// on are ignored:
//
//	add n1 n2 n3          start nodes (each joins the members up)
//	settle                let time run until membership converges
//	limit 10              the limit of the checks that follow (default 10)
//	check n1 k 4          4 checks of one hit on key k through n1
//	check * k 30          30 checks spread over the members up, in turn
//	expect k admitted=10  hits admitted on k so far (also admitted<=N,
//	                      refused=N, held=N: the count the cluster holds,
//	                      read by a check of 0 hits through the first member up)
//	leave n2              graceful leave (Leave, then Shutdown)
//	crash n2              kill: nothing it sends arrives, its store keeps what it flushed
//	restart n2            start again a member that left or crashed, on its store
//	partition n1,n2 n3    cut gossip and peer calls between the groups
//	drop n1 n2            lose everything n1 sends to n2
//	delay 100ms           delay every peer call
//	heal                  remove partitions, drops and delays
//	advance 2s            let the bubble's time run
//	skip <reason>         stop here: the rest shows a known issue (the
//	                      test skips, naming it)
//
// Every check must be answered (an error fails the scenario). A check's
// line is followed by its expected output, as raft's datadriven tests
// write it: a line "----", then the output, then a blank line:
//
//	check * k 30
//	----
//	admitted 10, refused 20; decided by n2
//
// The output names the nodes that decided the checks only when the
// cluster is steady: after a settle, with no membership or network step
// since (advance and checks keep it steady).
//
// TestScenarios fails on an output that differs, printing both, and
// rewrites every file's outputs with -rewrite.

// Step is one line of a scenario.
type Step struct {
	Line int    // 1-based line in the scenario text
	Op   string // the first word
	Args []string
	// Want is the expected output written below the step ("----", the
	// output, a blank line); Block says whether there was such a block,
	// and end is the 0-based index of the line after it (Rewrite).
	Want  string
	Block bool
	end   int
}

func (s Step) String() string { return strings.Join(append([]string{s.Op}, s.Args...), " ") }

// arity gives, for each operation, the least and most arguments (-1: any).
var arity = map[string][2]int{
	"add": {1, -1}, "settle": {0, 0}, "limit": {1, 1}, "check": {2, 3}, "expect": {2, 2},
	"leave": {1, 1}, "crash": {1, 1}, "restart": {1, 1}, "partition": {2, -1}, "drop": {2, 2},
	"delay": {1, 1}, "heal": {0, 0}, "advance": {1, 1}, "skip": {1, -1},
}

// SkipError is returned by Run at a skip step.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

// ParseScenario splits text into steps, checking each operation's name and
// number of arguments; name (a file name) prefixes every error.
func ParseScenario(name, text string) ([]Step, error) {
	var steps []Step
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if strings.TrimSpace(line) == blockMark {
			return nil, fmt.Errorf("%s:%d: %s without a step above it", name, i+1, blockMark)
		}
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		ar, ok := arity[f[0]]
		if !ok {
			return nil, fmt.Errorf("%s:%d: unknown step %q", name, i+1, f[0])
		}
		if n := len(f) - 1; n < ar[0] || (ar[1] >= 0 && n > ar[1]) {
			return nil, fmt.Errorf("%s:%d: %s takes %s arguments, got %d", name, i+1, f[0], arityText(ar), n)
		}
		st := Step{Line: i + 1, Op: f[0], Args: f[1:], end: i + 1}
		if i+1 < len(lines) && strings.TrimSpace(lines[i+1]) == blockMark {
			j := i + 2
			for j < len(lines) && strings.TrimSpace(lines[j]) != "" {
				j++
			}
			st.Block, st.Want, st.end = true, strings.Join(lines[i+2:j], "\n"), j
			i = j - 1
		}
		steps = append(steps, st)
	}
	return steps, nil
}

// blockMark opens a step's expected output.
const blockMark = "----"

// Rewrite returns text, whose steps ParseScenario returned, with each
// step's output block replaced by out[step line], or removed when the
// step has no output; everything else is kept as it is.
func Rewrite(text string, steps []Step, out map[int]string) string {
	lines := strings.Split(text, "\n")
	var b strings.Builder
	next := 0 // lines[:next] are written
	for _, st := range steps {
		b.WriteString(strings.Join(lines[next:st.Line], "\n"))
		b.WriteByte('\n')
		next = st.end
		if o, ok := out[st.Line]; ok {
			b.WriteString(blockMark + "\n" + o + "\n")
			if next >= len(lines) || strings.TrimSpace(lines[next]) != "" {
				b.WriteByte('\n') // a block ends at a blank line
			}
		}
	}
	b.WriteString(strings.Join(lines[next:], "\n"))
	return b.String()
}

func arityText(ar [2]int) string {
	switch {
	case ar[1] < 0:
		return fmt.Sprintf("at least %d", ar[0])
	case ar[0] == ar[1]:
		return strconv.Itoa(ar[0])
	}
	return fmt.Sprintf("%d to %d", ar[0], ar[1])
}

// Answer is one check's outcome as a Runner records it.
type Answer struct {
	Seq      int // order among answers and events
	At       time.Time
	Line     int
	Via, Key string
	Limit    int64
	Admitted bool
	Owner    string
}

// Runner runs scenario steps on a Cluster and records every answer.
type Runner struct {
	C       *Cluster
	Limit   int64
	Answers []Answer
	// Admitted and Refused count hits per key.
	Admitted, Refused map[string]int64
	// Events lists the membership and network steps with their time.
	Events []Event
	// Out is each step's output by its line: a check's admitted and
	// refused hits and the nodes that decided them.
	Out  map[int]string
	next int // round-robin position of check *
	seq  int // the last Seq given
	// steady: a settle ran, and no membership or network step since. Only
	// then does a check's output name the nodes that decided it: while
	// views converge, which node a check reaches first depends on when
	// each node learns of a change, which the seed does not fix.
	steady bool
}

// Event is a step that changed the cluster or its network.
type Event struct {
	Seq  int // order among answers and events
	At   time.Time
	Step Step
}

// NewRunner returns a runner on c with the default limit of 10.
func NewRunner(c *Cluster) *Runner {
	return &Runner{C: c, Limit: 10, Admitted: map[string]int64{}, Refused: map[string]int64{}, Out: map[int]string{}}
}

// Run runs steps in order and returns the first failure, naming its line.
func (r *Runner) Run(steps []Step) error {
	for _, s := range steps {
		if err := r.Step(s); err != nil {
			return fmt.Errorf("line %d (%s): %w", s.Line, s, err)
		}
	}
	return nil
}

// Step runs one step.
func (r *Runner) Step(s Step) error {
	c := r.C
	var err error
	switch s.Op {
	case "add":
		for _, name := range s.Args {
			if err = c.Add(name); err != nil {
				break
			}
		}
	case "settle":
		err = c.Settle()
		r.steady = err == nil
	case "limit":
		r.Limit, err = strconv.ParseInt(s.Args[0], 10, 64)
		if err == nil && r.Limit <= 0 {
			err = fmt.Errorf("limit %d is not positive", r.Limit)
		}
		return err
	case "check":
		return r.check(s)
	case "expect":
		return r.expect(s.Args[0], s.Args[1])
	case "leave":
		err = c.Leave(s.Args[0])
	case "crash":
		err = c.Crash(s.Args[0])
	case "restart":
		err = c.Restart(s.Args[0])
	case "partition":
		groups := make([][]string, len(s.Args))
		for i, g := range s.Args {
			groups[i] = strings.Split(g, ",")
		}
		err = c.Partition(groups...)
	case "drop":
		err = c.Drop(s.Args[0], s.Args[1])
	case "delay", "advance":
		var d time.Duration
		if d, err = time.ParseDuration(s.Args[0]); err != nil {
			return err
		}
		if d < 0 {
			return fmt.Errorf("negative duration %v", d)
		}
		if s.Op == "advance" {
			time.Sleep(d)
			return nil
		}
		c.Delay(d)
	case "heal":
		c.Heal()
	case "skip":
		return &SkipError{Reason: strings.Join(s.Args, " ")}
	default:
		return fmt.Errorf("unknown step %q", s.Op)
	}
	if s.Op != "settle" {
		r.steady = false
	}
	r.seq++
	r.Events = append(r.Events, Event{Seq: r.seq, At: time.Now(), Step: s})
	return err
}

// check runs a check step.
func (r *Runner) check(s Step) error {
	via, key, count := s.Args[0], s.Args[1], int64(1)
	if len(s.Args) == 3 {
		var err error
		if count, err = strconv.ParseInt(s.Args[2], 10, 64); err != nil || count < 1 {
			return fmt.Errorf("count %q is not a positive integer", s.Args[2])
		}
	}
	var admitted, refused int
	owners := map[string]bool{}
	defer func() {
		out := fmt.Sprintf("admitted %d, refused %d", admitted, refused)
		if r.steady {
			out += "; decided by " + strings.Join(slices.Sorted(maps.Keys(owners)), ", ")
		}
		r.Out[s.Line] = out
	}()
	for range count {
		v := via
		if via == "*" {
			up := r.C.Up()
			if len(up) == 0 {
				return fmt.Errorf("no member is up")
			}
			v = up[r.next%len(up)]
			r.next++
		}
		o, err := r.C.Check(v, key, r.Limit, 1)
		if err != nil {
			return err
		}
		r.seq++
		r.Answers = append(r.Answers, Answer{Seq: r.seq, At: time.Now(), Line: s.Line, Via: v, Key: key, Limit: r.Limit, Admitted: o.Allowed(), Owner: o.Owner})
		owners[o.Owner] = true
		if o.Allowed() {
			r.Admitted[key]++
			admitted++
		} else {
			r.Refused[key]++
			refused++
		}
	}
	return nil
}

// expect checks one expectation: what=admitted, refused or held, then =,
// <= or >=, then a number.
func (r *Runner) expect(key, cond string) error {
	what, op, want, err := parseCond(cond)
	if err != nil {
		return err
	}
	var got int64
	switch what {
	case "admitted":
		got = r.Admitted[key]
	case "refused":
		got = r.Refused[key]
	case "held":
		if got, err = r.Held(key); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown quantity %q (want admitted, refused or held)", what)
	}
	ok := got == want
	switch op {
	case "<=":
		ok = got <= want
	case ">=":
		ok = got >= want
	}
	if !ok {
		return fmt.Errorf("%s %s is %d, want %s%d (admitted %d, refused %d)", key, what, got, op, want, r.Admitted[key], r.Refused[key])
	}
	return nil
}

func parseCond(cond string) (what, op string, n int64, err error) {
	for _, o := range []string{"<=", ">=", "="} {
		if i := strings.Index(cond, o); i > 0 {
			what, op = cond[:i], o
			n, err = strconv.ParseInt(cond[i+len(o):], 10, 64)
			if err != nil {
				return "", "", 0, fmt.Errorf("expectation %q: %w", cond, err)
			}
			return what, op, n, nil
		}
	}
	return "", "", 0, fmt.Errorf("expectation %q: want <quantity>=N, <=N or >=N", cond)
}

// Held returns the count the cluster holds for key in the current window,
// read by a check of 0 hits through the first member up (the limit minus
// what remains: at most the limit).
func (r *Runner) Held(key string) (int64, error) {
	up := r.C.Up()
	if len(up) == 0 {
		return 0, fmt.Errorf("held %s: no member is up", key)
	}
	o, err := r.C.Check(up[0], key, r.Limit, 0)
	if err != nil {
		return 0, err
	}
	return r.Limit - o.Remaining, nil
}
