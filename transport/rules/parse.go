package rules

// Parsing a native rules file: the document, its rules, their modes and
// limits.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bucket"
)

// MaxLimitsPerRule is the largest number of limits one rule may have.
const MaxLimitsPerRule = 16

// Error is a rules file refused: where (file, line, column, field) and why.
// Every error of [Parse], [Load] and [Watcher.Reload] caused by the content
// of a file is an *Error.
type Error struct {
	File   string // the path of the file, as given or as found in the directory
	Line   int    // 1-based; 0 when unknown
	Column int    // 1-based; 0 when unknown
	Field  string // e.g. "rules[1].limits[0].window"; "" for YAML syntax errors
	Msg    string
}

// Error formats e as "file:line:column: field: message".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteString(":")
		b.WriteString(strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteString(":")
			b.WriteString(strconv.Itoa(e.Column))
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// rule is one parsed rule with where it was defined.
type rule struct {
	name   string
	limits []bucket.Limit
	file   string
	field  string // e.g. "rules[2].name"
	line   int
	column int
}

// parser walks the YAML node tree of one file. It checks the shape itself
// (rather than decoding into structs) so that every error carries the
// field's path, line and column, and unknown or repeated fields are errors.
type parser struct {
	file        string
	descriptors int // envoy-format descriptors built so far
}

func (p *parser) errAt(n *yaml.Node, field, format string, args ...any) *Error {
	e := &Error{File: p.file, Field: field, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

var yamlLineErr = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxErr turns an error of the YAML library into an *Error.
func (p *parser) syntaxErr(err error) *Error {
	msg := err.Error()
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &Error{File: p.file, Line: line, Msg: "YAML: " + m[2]}
	}
	return &Error{File: p.file, Msg: "YAML: " + strings.TrimPrefix(msg, "yaml: ")}
}

// parsed is the content of one rules file: Sluice rules, or one domain of
// envoyproxy/ratelimit's format.
type parsed struct {
	rules []rule
	envoy *envoyDomain
}

// parseFile parses and validates the content of one rules file. A file
// whose top level has a domain field is envoyproxy/ratelimit's format (see
// envoyparse.go); otherwise it is Sluice's. An empty file (or one holding only
// comments, or `rules:` with nothing) has no rules.
func parseFile(file string, data []byte) (parsed, error) {
	p := &parser{file: file}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return parsed{}, nil
		}
		return parsed{}, p.syntaxErr(err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return parsed{}, p.syntaxErr(err)
	default:
		return parsed{}, p.errAt(&extra, "", "more than one YAML document (one file holds one document)")
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return parsed{}, p.errAt(&doc, "", "not a YAML document")
	}
	root := resolve(doc.Content[0])
	if isNull(root) {
		return parsed{}, nil
	}
	pairs, err := p.mapping(root, "")
	if err != nil {
		return parsed{}, err
	}
	if isEnvoyFile(pairs) {
		d, err := p.envoyDoc(pairs)
		return parsed{envoy: d}, err
	}
	rules, err := p.nativeDoc(pairs)
	return parsed{rules: rules}, err
}

// nativeDoc parses the top-level fields of a Sluice rules file.
func (p *parser) nativeDoc(pairs []pair) ([]rule, error) {
	var list *yaml.Node
	for _, kv := range pairs {
		switch kv.key {
		case "rules":
			list = kv.val
		default:
			return nil, p.unknown(kv, "", "rules (Sluice's format) or domain (envoyproxy/ratelimit's)")
		}
	}
	if list == nil || isNull(list) {
		return nil, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, p.errAt(list, "rules", "must be a list of rules, not %s", describe(list))
	}
	rules := make([]rule, 0, len(list.Content))
	seen := make(map[string]*rule, len(list.Content))
	for i, item := range list.Content {
		r, err := p.rule(resolve(item), fmt.Sprintf("rules[%d]", i))
		if err != nil {
			return nil, err
		}
		if prev, ok := seen[r.name]; ok {
			return nil, &Error{File: p.file, Line: r.line, Column: r.column, Field: r.field,
				Msg: fmt.Sprintf("%q is already defined at %s:%d:%d", r.name, prev.file, prev.line, prev.column)}
		}
		rules = append(rules, r)
		seen[r.name] = &rules[len(rules)-1]
	}
	return rules, nil
}

// modeFields are the fields a rule sets for all its limits and a limit may
// set for itself. nil means not set.
type modeFields struct {
	mode         *bucket.Mode
	softPercent  *int64
	ceiling      *int64
	loadPercent  *int64
	countRefused *bool
}

// field parses one of the mode fields; ok is false when key is not one.
func (p *parser) modeField(m *modeFields, kv pair, path string) (ok bool, err error) {
	fp := join(path, kv.key)
	switch kv.key {
	case "mode":
		s, err := p.str(kv.val, fp)
		if err != nil {
			return true, err
		}
		mode, perr := bucket.ParseMode(s)
		if perr != nil {
			return true, p.errAt(kv.val, fp, "%v", perr)
		}
		m.mode = &mode
	case "soft_percent":
		v, err := p.intIn(kv.val, fp, 1, bucket.MaxSoftPercent)
		if err != nil {
			return true, err
		}
		m.softPercent = &v
	case "elastic_ceiling":
		v, err := p.intIn(kv.val, fp, 1, bucket.MaxLimit)
		if err != nil {
			return true, err
		}
		m.ceiling = &v
	case "elastic_load_percent":
		v, err := p.intIn(kv.val, fp, 1, 100)
		if err != nil {
			return true, err
		}
		m.loadPercent = &v
	case "count_refused":
		v, err := p.bool(kv.val, fp)
		if err != nil {
			return true, err
		}
		m.countRefused = &v
	default:
		return false, nil
	}
	return true, nil
}

var ruleFields = "name, limits, mode, soft_percent, elastic_ceiling, elastic_load_percent, count_refused"

func (p *parser) rule(n *yaml.Node, path string) (rule, error) {
	pairs, err := p.mapping(n, path)
	if err != nil {
		return rule{}, err
	}
	var (
		r          = rule{file: p.file}
		nameNode   *yaml.Node
		limitsNode *yaml.Node
		defaults   modeFields
		fieldNodes = map[string]*yaml.Node{}
	)
	for _, kv := range pairs {
		fieldNodes[kv.key] = kv.val
		switch kv.key {
		case "name":
			nameNode = kv.val
		case "limits":
			limitsNode = kv.val
		default:
			ok, err := p.modeField(&defaults, kv, path)
			if err != nil {
				return rule{}, err
			}
			if !ok {
				return rule{}, p.unknown(kv, path, ruleFields)
			}
		}
	}
	if nameNode == nil {
		return rule{}, p.errAt(n, path, "name is required")
	}
	name, err := p.name(nameNode, join(path, "name"))
	if err != nil {
		return rule{}, err
	}
	r.name, r.field, r.line, r.column = name, join(path, "name"), nameNode.Line, nameNode.Column

	// The rule's mode parameters must belong to the rule's mode.
	mode := bucket.ModeHard
	if defaults.mode != nil {
		mode = *defaults.mode
	}
	if defaults.softPercent != nil && mode != bucket.ModeSoft {
		return rule{}, p.errAt(fieldNodes["soft_percent"], join(path, "soft_percent"), "applies only to mode soft, not %s", mode)
	}
	for _, f := range []string{"elastic_ceiling", "elastic_load_percent"} {
		if fieldNodes[f] != nil && mode != bucket.ModeElastic {
			return rule{}, p.errAt(fieldNodes[f], join(path, f), "applies only to mode elastic, not %s", mode)
		}
	}

	if limitsNode == nil || isNull(limitsNode) {
		return rule{}, p.errAt(n, path, "limits is required (at least one limit)")
	}
	lp := join(path, "limits")
	if limitsNode.Kind != yaml.SequenceNode {
		return rule{}, p.errAt(limitsNode, lp, "must be a list of limits, not %s", describe(limitsNode))
	}
	switch k := len(limitsNode.Content); {
	case k == 0:
		return rule{}, p.errAt(limitsNode, lp, "a rule needs at least one limit")
	case k > MaxLimitsPerRule:
		return rule{}, p.errAt(limitsNode, lp, "%d limits, more than %d", k, MaxLimitsPerRule)
	}
	r.limits = make([]bucket.Limit, len(limitsNode.Content))
	for j, item := range limitsNode.Content {
		lim, err := p.limit(resolve(item), fmt.Sprintf("%s[%d]", lp, j), &defaults)
		if err != nil {
			return rule{}, err
		}
		r.limits[j] = lim
	}
	return r, nil
}

var limitFields = "limit, window, algorithm, burst, sub_windows, shaping, calendar, calendar_tz, global, mode, soft_percent, elastic_ceiling, elastic_load_percent, count_refused"

// limit parses one limit and applies the rule's defaults: count_refused
// when the limit does not set it; soft_percent, elastic_ceiling and
// elastic_load_percent when the limit does not set them and its mode is the
// rule's mode.
func (p *parser) limit(n *yaml.Node, path string, defaults *modeFields) (bucket.Limit, error) {
	pairs, err := p.mapping(n, path)
	if err != nil {
		return bucket.Limit{}, err
	}
	lim, own, has, err := p.readLimit(pairs, path)
	if err != nil {
		return lim, err
	}
	if !has.limit {
		return lim, p.errAt(n, path, "limit is required")
	}
	switch {
	case has.window:
	case has.calendar:
		lim.WindowMS = calendarWindowMS(lim.Calendar)
	default:
		return lim, p.errAt(n, path, "window is required (or calendar: day, week or month)")
	}
	switch {
	case has.algorithm:
	case has.calendar:
		lim.Algorithm = bucket.FixedWindow
	default:
		lim.Algorithm = bucket.SlidingWindow
	}
	inheritMode(&lim, &own, defaults)
	if err := lim.Validate(); err != nil {
		return lim, p.errAt(n, path, "%v", err)
	}
	return lim, nil
}

// limitHas says which of a limit's fields the file sets.
type limitHas struct{ limit, window, algorithm, calendar bool }

// readLimit reads the fields of a limit at path; its mode fields go to
// own.
func (p *parser) readLimit(pairs []pair, path string) (lim bucket.Limit, own modeFields, has limitHas, err error) {
	for _, kv := range pairs {
		fp := join(path, kv.key)
		switch kv.key {
		case "limit":
			if lim.Limit, err = p.intIn(kv.val, fp, 0, bucket.MaxLimit); err != nil {
				return lim, own, has, err
			}
			has.limit = true
		case "window":
			if lim.WindowMS, err = p.window(kv.val, fp); err != nil {
				return lim, own, has, err
			}
			has.window = true
		case "algorithm":
			s, err := p.str(kv.val, fp)
			if err != nil {
				return lim, own, has, err
			}
			a, perr := bucket.ParseAlgorithm(s)
			if perr != nil {
				return lim, own, has, p.errAt(kv.val, fp, "%v", perr)
			}
			lim.Algorithm, has.algorithm = a, true
		case "burst":
			if lim.Burst, err = p.intIn(kv.val, fp, 0, bucket.MaxLimit); err != nil {
				return lim, own, has, err
			}
		case "sub_windows":
			if lim.SubWindows, err = p.intIn(kv.val, fp, 0, bucket.MaxSubWindows); err != nil {
				return lim, own, has, err
			}
		case "shaping":
			if lim.Shaping, err = p.bool(kv.val, fp); err != nil {
				return lim, own, has, err
			}
		case "global":
			if lim.Global, err = p.bool(kv.val, fp); err != nil {
				return lim, own, has, err
			}
		case "calendar":
			s, err := p.str(kv.val, fp)
			if err != nil {
				return lim, own, has, err
			}
			c, perr := bucket.ParseCalendar(s)
			if perr != nil {
				return lim, own, has, p.errAt(kv.val, fp, "%v", perr)
			}
			lim.Calendar, has.calendar = c, c != bucket.CalendarNone
		case "calendar_tz":
			s, err := p.str(kv.val, fp)
			if err != nil {
				return lim, own, has, err
			}
			if _, zerr := bucket.LoadZone(s); zerr != nil {
				return lim, own, has, p.errAt(kv.val, fp, "%v", zerr)
			}
			lim.CalendarTZ = s
		default:
			ok, err := p.modeField(&own, kv, path)
			if err != nil {
				return lim, own, has, err
			}
			if !ok {
				return lim, own, has, p.unknown(kv, path, limitFields)
			}
		}
	}
	return lim, own, has, nil
}

// inheritMode sets lim's mode, the limit's own or else the rule's
// (defaults); soft_percent, elastic_ceiling and elastic_load_percent, its
// own or else, when its mode is the rule's, the rule's; and count_refused,
// its own or else the rule's.
func inheritMode(lim *bucket.Limit, own, defaults *modeFields) {
	ruleMode := bucket.ModeHard
	if defaults.mode != nil {
		ruleMode = *defaults.mode
	}
	lim.Mode = ruleMode
	if own.mode != nil {
		lim.Mode = *own.mode
	}
	inherit := lim.Mode == ruleMode
	lim.SoftPercent = pick(own.softPercent, defaults.softPercent, inherit)
	lim.ElasticCeiling = pick(own.ceiling, defaults.ceiling, inherit)
	lim.ElasticLoadPercent = pick(own.loadPercent, defaults.loadPercent, inherit)
	switch {
	case own.countRefused != nil:
		lim.CountRefused = *own.countRefused
	case defaults.countRefused != nil:
		lim.CountRefused = *defaults.countRefused
	}
}

func pick(own, rule *int64, inherit bool) int64 {
	switch {
	case own != nil:
		return *own
	case rule != nil && inherit:
		return *rule
	}
	return 0
}

// calendarWindowMS is the WindowMS given to a calendar limit written
// without a window: the calendar's longest length (the bucket package only
// needs a valid window for calendar limits).
func calendarWindowMS(c bucket.Calendar) int64 {
	const day = 24 * 60 * 60 * 1000
	switch c {
	case bucket.CalendarWeek:
		return 7 * day
	case bucket.CalendarMonth:
		return 31 * day
	}
	return day
}
