package rules

// Reading a file in Envoy's ratelimit format: domains, nested descriptors
// and their rate limits, and Sluice's extension fields, into the tree of
// envoyNodes that MatchEnvoy walks.

import (
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bucket"
)

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
	d, err := p.readDescriptor(c, pairs, path)
	if err != nil {
		return nil, err
	}
	if d.keyNode == nil || c.key == "" {
		at := d.keyNode
		if at == nil {
			at = n
		}
		return nil, p.errAt(at, join(path, "key"), "a descriptor needs a non-empty key")
	}
	if c.share && !strings.Contains(c.value, "*") {
		return nil, p.errAt(d.shareNode, join(path, "share_threshold"), "applies only to a value with a '*' wildcard, not %q", c.value)
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
	if d.rateNode != nil && !isNull(d.rateNode) {
		r, err := p.envoyRateLimit(d.rateNode, join(path, "rate_limit"))
		if err != nil {
			return nil, err
		}
		r.ShadowMode, r.QuotaMode, r.Path = d.shadow, d.quota, here
		if myShared != nil {
			r.Shared = slices.Clip(myShared)
		}
		c.rule = r
		*count++
	}
	if err := p.envoyLevel(c, d.childList, join(path, "descriptors"), here, myShared, depth+1, count); err != nil {
		return nil, err
	}
	return c, nil
}

// descriptorFields are the fields of a descriptor that readDescriptor does
// not keep in its envoyNode.
type descriptorFields struct {
	keyNode, rateNode, childList, shareNode *yaml.Node
	shadow, quota                           bool
}

// readDescriptor reads the fields of the descriptor at path: its key,
// value and share_threshold into c, the others into d.
func (p *parser) readDescriptor(c *envoyNode, pairs []pair, path string) (d descriptorFields, err error) {
	for _, kv := range pairs {
		fp := join(path, kv.key)
		switch kv.key {
		case "key":
			if c.key, err = p.scalarString(kv.val, fp); err != nil {
				return d, err
			}
			d.keyNode = kv.val
		case "value":
			if c.value, err = p.scalarString(kv.val, fp); err != nil {
				return d, err
			}
		case "rate_limit":
			d.rateNode = kv.val
		case "descriptors":
			d.childList = kv.val
		case "shadow_mode":
			if d.shadow, err = p.bool(kv.val, fp); err != nil {
				return d, err
			}
		case "quota_mode":
			if d.quota, err = p.bool(kv.val, fp); err != nil {
				return d, err
			}
		case "share_threshold":
			if c.share, err = p.bool(kv.val, fp); err != nil {
				return d, err
			}
			d.shareNode = kv.val
		case "detailed_metric", "value_to_metric":
			// Metric naming in envoyproxy/ratelimit; accepted, no effect here.
			if _, err = p.bool(kv.val, fp); err != nil {
				return d, err
			}
		case "metadata":
			// Returned to Envoy as dynamic metadata by envoyproxy/ratelimit;
			// accepted, not returned here.
			if kv.val.Kind != yaml.MappingNode && !isNull(kv.val) {
				return d, p.errAt(kv.val, fp, "must be a mapping, not %s", describe(kv.val))
			}
		default:
			return d, p.unknown(kv, path, envoyDescriptorFields)
		}
	}
	return d, nil
}

var envoyRateLimitFields = "requests_per_unit, unit, unlimited, name, replaces, sluice"

// envoyRateLimit parses a descriptor's rate_limit at path.
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
		if r.Replaces, err = p.envoyReplaces(replacesNode, join(path, "replaces"), r.Name); err != nil {
			return nil, err
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

// envoyReplaces parses the replaces list n at path of the rate limit named
// own: the names of the rules it replaces.
func (p *parser) envoyReplaces(n *yaml.Node, path, own string) ([]string, error) {
	var names []string
	if n.Kind != yaml.SequenceNode {
		return nil, p.errAt(n, path, "must be a list of {name: ...}, not %s", describe(n))
	}
	for i, item := range n.Content {
		ip := fmt.Sprintf("%s[%d]", path, i)
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
		case name == own:
			return nil, p.errAt(item, ip, "a rate limit cannot replace its own name %q", name)
		}
		names = append(names, name)
	}
	return names, nil
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
