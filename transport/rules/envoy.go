package rules

// Envoy's descriptors: units, the matched rule (EnvoyRule), the tree of
// descriptors per domain that MatchEnvoy walks, and its hash.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"slices"
	"strings"

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
