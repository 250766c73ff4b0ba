package rules

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bucket"
)

// EnvoyUnit is the unit of an envoy-format limit. The numbers are those of
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
type EnvoyUnit int32

// The units. Every one is a fixed number of seconds, as envoyproxy/ratelimit
// counts them: a month is 30 days and a year 365 days, and windows are
// aligned to multiples of the unit since the Unix epoch.
const (
	UnitUnknown EnvoyUnit = 0
	UnitSecond  EnvoyUnit = 1
	UnitMinute  EnvoyUnit = 2
	UnitHour    EnvoyUnit = 3
	UnitDay     EnvoyUnit = 4
	UnitMonth   EnvoyUnit = 5
	UnitYear    EnvoyUnit = 6
	UnitWeek    EnvoyUnit = 7
)

// Seconds returns the length of the unit in seconds, 0 for an unknown unit.
func (u EnvoyUnit) Seconds() int64 {
	const day = 24 * 60 * 60
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 60 * 60
	case UnitDay:
		return day
	case UnitWeek:
		return 7 * day
	case UnitMonth:
		return 30 * day
	case UnitYear:
		return 365 * day
	}
	return 0
}

var unitNames = map[string]EnvoyUnit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// String returns the unit's name as envoy-format files write it.
func (u EnvoyUnit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

// MaxEnvoyDepth is the deepest nesting of descriptors an envoy-format file
// may have, and MaxEnvoyDescriptors the most descriptors it may define
// (counting those YAML aliases repeat).
const (
	MaxEnvoyDepth       = 32
	MaxEnvoyDescriptors = 100_000
)

// EnvoyRule is the rate limit of one descriptor path of an envoy-format
// file. It is immutable: many goroutines share it.
type EnvoyRule struct {
	// Limit is what a check counts with: requests_per_unit per unit,
	// fixed_window aligned to the unit unless the Sluice extension picks
	// another algorithm. Limit.Limit 0 refuses everything. Zero when
	// Unlimited.
	Limit bucket.Limit
	// Unit is the unit as written; UnitUnknown when Unlimited.
	Unit EnvoyUnit
	// Unlimited: descriptors that match are never limited (and nothing is
	// counted).
	Unlimited bool
	// ShadowMode: answer OK even when over the limit (the refusal is still
	// counted and reported in metrics).
	ShadowMode bool
	// QuotaMode: an over-limit answer of this rule makes the overall
	// answer OVER_LIMIT only when every quota-mode descriptor of the
	// request is over.
	QuotaMode bool
	// CountRefusedSet: the file set sluice.count_refused, so
	// Limit.CountRefused is the file's choice; otherwise it is the default
	// (true, as envoyproxy/ratelimit increments refused hits) and the
	// server may override it.
	CountRefusedSet bool
	// Name is rate_limit.name ("" when unset); Replaces the names this
	// rule's limit replaces when both match in one request.
	Name     string
	Replaces []string
	// Shared has one element per level of the path, or is nil: a non-empty
	// element is the wildcard value pattern of a share_threshold level, so
	// every value it matches counts in one counter.
	Shared []string
	// Path names the rule for logs: "domain.key_value.key".
	Path string
}

// EnvoyEntry is one entry of a request's descriptor.
type EnvoyEntry struct {
	Key, Value string
}

// envoyDomain is one domain of an envoy-format file.
type envoyDomain struct {
	domain string
	name   string // the check name of the domain's counters (EnvoyName)
	root   envoyNode
	rules  int // nodes with a rate_limit
	file   string
	line   int
	column int
}

// envoyNode is one level of descriptors: the children of a descriptor (or of
// the domain) and the rule of the descriptor itself.
type envoyNode struct {
	exact map[EnvoyEntry]*envoyNode // value set, no '*'
	wild  []wildChild               // value with '*', in file order
	byKey map[string]*envoyNode     // no value
	rule  *EnvoyRule
	// for hashing and errors
	key, value string
	share      bool
}

type wildChild struct {
	key   string
	parts []string // the value split at '*'
	node  *envoyNode
}

// child finds the child that matches e: the exact key and value first, then
// the first wildcard value (in file order) that matches, then the key
// alone. This is envoyproxy/ratelimit's order.
func (n *envoyNode) child(e EnvoyEntry) *envoyNode {
	if c := n.exact[e]; c != nil {
		return c
	}
	for i := range n.wild {
		if w := &n.wild[i]; w.key == e.Key && wildcardMatch(w.parts, e.Value) {
			return w.node
		}
	}
	return n.byKey[e.Key]
}

// wildcardMatch reports whether value matches the pattern split at its '*'s
// (each '*' matches any run of bytes, the empty one included).
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// EnvoyName is the check name under which the counters of an envoy domain
// live: "envoy:" and the domain, or, for a domain too long for a name or
// holding a NUL byte, "envoy#" and the first 32 hex digits of the domain's
// SHA-256. The two forms never meet, so two domains never share a name.
func EnvoyName(domain string) string {
	if len("envoy:")+len(domain) <= bucket.MaxNameLen && strings.IndexByte(domain, 0) < 0 {
		return "envoy:" + domain
	}
	sum := sha256.Sum256([]byte(domain))
	return "envoy#" + hex.EncodeToString(sum[:16])
}

// MatchEnvoy finds the rule of one descriptor of domain, as
// envoyproxy/ratelimit does: level by level, each entry takes the exact
// key and value, else the first wildcard value that matches, else the key
// alone; a descriptor of N entries matches only a rule at depth N. name is
// the domain's counter name (EnvoyName) and known whether the domain is in
// the rules at all; rule is nil when nothing matched. It allocates nothing.
func (s *Set) MatchEnvoy(domain string, entries []EnvoyEntry) (rule *EnvoyRule, name string, known bool) {
	if s == nil {
		return nil, "", false
	}
	d := s.envoy[domain]
	if d == nil {
		return nil, "", false
	}
	n := &d.root
	for _, e := range entries {
		if n = n.child(e); n == nil {
			return nil, d.name, true
		}
	}
	if len(entries) == 0 {
		return nil, d.name, true
	}
	return n.rule, d.name, true
}

// EnvoyDomains returns the envoy domains, sorted.
func (s *Set) EnvoyDomains() []string {
	if s == nil {
		return nil
	}
	ds := make([]string, 0, len(s.envoy))
	for d := range s.envoy {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds
}

// MatchEnvoy matches in the Set in force; see [Set.MatchEnvoy].
func (w *Watcher) MatchEnvoy(domain string, entries []EnvoyEntry) (*EnvoyRule, string, bool) {
	return w.cur.Load().MatchEnvoy(domain, entries)
}

// isEnvoyFile reports whether the top-level fields are those of an
// envoy-format file (a domain field).
func isEnvoyFile(pairs []pair) bool {
	for _, kv := range pairs {
		if kv.key == "domain" {
			return true
		}
	}
	return false
}

// envoyDoc parses the top-level mapping of an envoy-format file.
func (p *parser) envoyDoc(pairs []pair) (*envoyDomain, error) {
	d := &envoyDomain{file: p.file}
	var list *yaml.Node
	for _, kv := range pairs {
		switch kv.key {
		case "domain":
			v, err := p.scalarString(kv.val, "domain")
			if err != nil {
				return nil, err
			}
			if v == "" {
				return nil, p.errAt(kv.val, "domain", "must not be empty")
			}
			d.domain, d.line, d.column = v, kv.val.Line, kv.val.Column
		case "descriptors":
			list = kv.val
		case "rules":
			return nil, p.errAt(kv.keyNode, "rules", "a file is either Sluice's (rules:) or envoyproxy/ratelimit's (domain:), not both")
		default:
			return nil, p.unknown(kv, "", "domain, descriptors")
		}
	}
	d.name = EnvoyName(d.domain)
	if err := p.envoyLevel(&d.root, list, "descriptors", d.domain, nil, 1, &d.rules); err != nil {
		return nil, err
	}
	return d, nil
}

var envoyDescriptorFields = "key, value, rate_limit, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold, metadata"

// envoyLevel parses a list of descriptors into the children of n. shared
// is the share_threshold patterns of the levels above.
func (p *parser) envoyLevel(n *envoyNode, list *yaml.Node, path, parentPath string, shared []string, depth int, count *int) error {
	if list == nil || isNull(list) {
		return nil
	}
	if list.Kind != yaml.SequenceNode {
		return p.errAt(list, path, "must be a list of descriptors, not %s", describe(list))
	}
	if depth > MaxEnvoyDepth {
		return p.errAt(list, path, "descriptors nested more than %d deep", MaxEnvoyDepth)
	}
	for i, item := range list.Content {
		ip := fmt.Sprintf("%s[%d]", path, i)
		c, err := p.envoyDescriptor(resolve(item), ip, parentPath, shared, depth, count)
		if err != nil {
			return err
		}
		switch {
		case c.value == "":
			if n.byKey == nil {
				n.byKey = make(map[string]*envoyNode)
			}
			if _, dup := n.byKey[c.key]; dup {
				return p.errAt(item, ip, "descriptor key %q without a value is defined twice at this level", c.key)
			}
			n.byKey[c.key] = c
		case strings.Contains(c.value, "*"):
			for _, w := range n.wild {
				if w.key == c.key && w.node.value == c.value {
					return p.errAt(item, ip, "descriptor %q = %q is defined twice at this level", c.key, c.value)
				}
			}
			n.wild = append(n.wild, wildChild{key: c.key, parts: strings.Split(c.value, "*"), node: c})
		default:
			if n.exact == nil {
				n.exact = make(map[EnvoyEntry]*envoyNode)
			}
			e := EnvoyEntry{Key: c.key, Value: c.value}
			if _, dup := n.exact[e]; dup {
				return p.errAt(item, ip, "descriptor %q = %q is defined twice at this level", c.key, c.value)
			}
			n.exact[e] = c
		}
	}
	return nil
}

func (p *parser) envoyDescriptor(n *yaml.Node, path, parentPath string, shared []string, depth int, count *int) (*envoyNode, error) {
	if p.descriptors++; p.descriptors > MaxEnvoyDescriptors {
		return nil, p.errAt(n, path, "more than %d descriptors in one file", MaxEnvoyDescriptors)
	}
	pairs, err := p.mapping(n, path)
	if err != nil {
		return nil, err
	}
	c := &envoyNode{}
	var keyNode, rateNode, childList, shareNode *yaml.Node
	var shadow, quota bool
	for _, kv := range pairs {
		fp := join(path, kv.key)
		switch kv.key {
		case "key":
			if c.key, err = p.scalarString(kv.val, fp); err != nil {
				return nil, err
			}
			keyNode = kv.val
		case "value":
			if c.value, err = p.scalarString(kv.val, fp); err != nil {
				return nil, err
			}
		case "rate_limit":
			rateNode = kv.val
		case "descriptors":
			childList = kv.val
		case "shadow_mode":
			if shadow, err = p.bool(kv.val, fp); err != nil {
				return nil, err
			}
		case "quota_mode":
			if quota, err = p.bool(kv.val, fp); err != nil {
				return nil, err
			}
		case "share_threshold":
			if c.share, err = p.bool(kv.val, fp); err != nil {
				return nil, err
			}
			shareNode = kv.val
		case "detailed_metric", "value_to_metric":
			// Metric naming in envoyproxy/ratelimit; accepted, no effect here.
			if _, err = p.bool(kv.val, fp); err != nil {
				return nil, err
			}
		case "metadata":
			// Returned to Envoy as dynamic metadata by envoyproxy/ratelimit;
			// accepted, not returned here.
			if kv.val.Kind != yaml.MappingNode && !isNull(kv.val) {
				return nil, p.errAt(kv.val, fp, "must be a mapping, not %s", describe(kv.val))
			}
		default:
			return nil, p.unknown(kv, path, envoyDescriptorFields)
		}
	}
	if keyNode == nil || c.key == "" {
		at := keyNode
		if at == nil {
			at = n
		}
		return nil, p.errAt(at, join(path, "key"), "a descriptor needs a non-empty key")
	}
	if c.share && !strings.Contains(c.value, "*") {
		return nil, p.errAt(shareNode, join(path, "share_threshold"), "applies only to a value with a '*' wildcard, not %q", c.value)
	}
	level := c.key
	if c.value != "" {
		level += "_" + c.value
	}
	here := parentPath + "." + level
	myShared := shared
	if c.share || shared != nil {
		myShared = make([]string, depth)
		copy(myShared, shared)
		if c.share {
			myShared[depth-1] = c.value
		}
	}
	if rateNode != nil && !isNull(rateNode) {
		r, err := p.envoyRateLimit(rateNode, join(path, "rate_limit"))
		if err != nil {
			return nil, err
		}
		r.ShadowMode, r.QuotaMode, r.Path = shadow, quota, here
		if myShared != nil {
			r.Shared = slices.Clip(myShared)
		}
		c.rule = r
		*count++
	}
	if err := p.envoyLevel(c, childList, join(path, "descriptors"), here, myShared, depth+1, count); err != nil {
		return nil, err
	}
	return c, nil
}

var envoyRateLimitFields = "requests_per_unit, unit, unlimited, name, replaces, sluice"

func (p *parser) envoyRateLimit(n *yaml.Node, path string) (*EnvoyRule, error) {
	pairs, err := p.mapping(n, path)
	if err != nil {
		return nil, err
	}
	r := &EnvoyRule{}
	var (
		rpu               int64
		unitNode, extNode *yaml.Node
		unitSet           bool
		replacesNode      *yaml.Node
	)
	for _, kv := range pairs {
		fp := join(path, kv.key)
		switch kv.key {
		case "requests_per_unit":
			if rpu, err = p.intIn(kv.val, fp, 0, 1<<32-1); err != nil {
				return nil, err
			}
		case "unit":
			s, err := p.str(kv.val, fp)
			if err != nil {
				return nil, err
			}
			u, ok := unitNames[strings.ToLower(s)]
			if !ok {
				return nil, p.errAt(kv.val, fp, "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
			}
			r.Unit, unitNode, unitSet = u, kv.val, true
		case "unlimited":
			if r.Unlimited, err = p.bool(kv.val, fp); err != nil {
				return nil, err
			}
		case "name":
			if r.Name, err = p.scalarString(kv.val, fp); err != nil {
				return nil, err
			}
		case "replaces":
			replacesNode = kv.val
		case "sluice":
			extNode = kv.val
		default:
			return nil, p.unknown(kv, path, envoyRateLimitFields)
		}
	}
	switch {
	case r.Unlimited && unitSet:
		return nil, p.errAt(unitNode, join(path, "unit"), "an unlimited rate limit takes no unit")
	case r.Unlimited && extNode != nil:
		return nil, p.errAt(extNode, join(path, "sluice"), "an unlimited rate limit takes no algorithm")
	case !r.Unlimited && !unitSet:
		return nil, p.errAt(n, path, "unit is required (second, minute, hour, day, week, month or year)")
	}
	// A missing requests_per_unit is 0, which refuses every request, as
	// envoyproxy/ratelimit reads it.
	if replacesNode != nil && !isNull(replacesNode) {
		if replacesNode.Kind != yaml.SequenceNode {
			return nil, p.errAt(replacesNode, join(path, "replaces"), "must be a list of {name: ...}, not %s", describe(replacesNode))
		}
		for i, item := range replacesNode.Content {
			ip := fmt.Sprintf("%s[%d]", join(path, "replaces"), i)
			pairs, err := p.mapping(resolve(item), ip)
			if err != nil {
				return nil, err
			}
			var name string
			for _, kv := range pairs {
				if kv.key != "name" {
					return nil, p.unknown(kv, ip, "name")
				}
				if name, err = p.scalarString(kv.val, join(ip, "name")); err != nil {
					return nil, err
				}
			}
			switch {
			case name == "":
				return nil, p.errAt(item, ip, "replaces needs a non-empty name")
			case name == r.Name:
				return nil, p.errAt(item, ip, "a rate limit cannot replace its own name %q", name)
			}
			r.Replaces = append(r.Replaces, name)
		}
	}
	if r.Unlimited {
		return r, nil
	}
	r.Limit = bucket.Limit{
		Algorithm:    bucket.FixedWindow,
		Limit:        rpu,
		WindowMS:     r.Unit.Seconds() * 1000,
		CountRefused: true,
	}
	if extNode != nil {
		if err := p.envoyExtension(extNode, join(path, "sluice"), r); err != nil {
			return nil, err
		}
	}
	if err := r.Limit.Validate(); err != nil {
		return nil, p.errAt(n, path, "%v", err)
	}
	return r, nil
}

// envoyExtension parses rate_limit.sluice, the Sluice extension of the
// envoy format (envoyproxy/ratelimit's own loader refuses the file: it is an
// unknown key there).
func (p *parser) envoyExtension(n *yaml.Node, path string, r *EnvoyRule) error {
	pairs, err := p.mapping(n, path)
	if err != nil {
		return err
	}
	for _, kv := range pairs {
		fp := join(path, kv.key)
		switch kv.key {
		case "algorithm":
			s, err := p.str(kv.val, fp)
			if err != nil {
				return err
			}
			a, perr := bucket.ParseAlgorithm(s)
			if perr != nil {
				return p.errAt(kv.val, fp, "%v", perr)
			}
			r.Limit.Algorithm = a
		case "burst":
			if r.Limit.Burst, err = p.intIn(kv.val, fp, 0, bucket.MaxLimit); err != nil {
				return err
			}
		case "count_refused":
			if r.Limit.CountRefused, err = p.bool(kv.val, fp); err != nil {
				return err
			}
			r.CountRefusedSet = true
		default:
			return p.unknown(kv, path, "algorithm, burst, count_refused")
		}
	}
	return nil
}

// scalarString reads a string field that YAML may have typed otherwise:
// any scalar but null, taken as written (value: 404 is "404"), as
// envoyproxy/ratelimit's loader reads it.
func (p *parser) scalarString(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return "", p.errAt(n, field, "must be a string, not %s", describe(n))
	}
	return n.Value, nil
}

// hashEnvoy adds the effective envoy rules to h, domains in order.
func hashEnvoy(h hash.Hash, m map[string]*envoyDomain) {
	domains := make([]string, 0, len(m))
	for d := range m {
		domains = append(domains, d)
	}
	slices.Sort(domains)
	var b []byte
	for _, d := range domains {
		b = appendStr(b[:0], "domain")
		b = appendStr(b, d)
		h.Write(b)
		hashEnvoyNode(h, &m[d].root)
	}
}

func hashEnvoyNode(h hash.Hash, n *envoyNode) {
	var b []byte
	if r := n.rule; r != nil {
		b = appendStr(b, "rule")
		b = append(b, boolByte(r.Unlimited), boolByte(r.ShadowMode), boolByte(r.QuotaMode), boolByte(r.CountRefusedSet),
			byte(r.Limit.Algorithm), boolByte(r.Limit.CountRefused), byte(r.Unit))
		for _, v := range []int64{r.Limit.Limit, r.Limit.WindowMS, r.Limit.Burst} {
			b = binary.AppendVarint(b, v)
		}
		b = appendStr(b, r.Name)
		b = binary.AppendUvarint(b, uint64(len(r.Replaces)))
		for _, s := range r.Replaces {
			b = appendStr(b, s)
		}
		b = binary.AppendUvarint(b, uint64(len(r.Shared)))
		for _, s := range r.Shared {
			b = appendStr(b, s)
		}
	}
	exact := make([]EnvoyEntry, 0, len(n.exact))
	for e := range n.exact {
		exact = append(exact, e)
	}
	slices.SortFunc(exact, func(a, b EnvoyEntry) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	keys := make([]string, 0, len(n.byKey))
	for k := range n.byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = binary.AppendUvarint(b, uint64(len(exact)))
	b = binary.AppendUvarint(b, uint64(len(n.wild)))
	b = binary.AppendUvarint(b, uint64(len(keys)))
	h.Write(b)
	child := func(kind, k, v string, c *envoyNode) {
		h.Write(appendStr(appendStr(appendStr(nil, kind), k), v))
		hashEnvoyNode(h, c)
	}
	for _, e := range exact {
		child("exact", e.Key, e.Value, n.exact[e])
	}
	for _, w := range n.wild {
		child("wild", w.key, w.node.value, w.node)
	}
	for _, k := range keys {
		child("key", k, "", n.byKey[k])
	}
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
