package rules

// Reading YAML nodes: mappings with distinct keys, and scalars (strings,
// names, bounded integers, booleans, windows), each refused with an Error
// that names its line and path.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/bucket"
)

// pair is one key and value of a mapping.
type pair struct {
	key     string
	keyNode *yaml.Node
	val     *yaml.Node
}

// mapping returns the pairs of the mapping n, refusing anything that is not
// a mapping with distinct plain string keys.
func (p *parser) mapping(n *yaml.Node, path string) ([]pair, error) {
	if n.Kind != yaml.MappingNode {
		what := "the file"
		if path != "" {
			what = "a rule"
			if strings.Contains(path, ".limits[") {
				what = "a limit"
			}
		}
		return nil, p.errAt(n, path, "%s must be a mapping of fields, not %s", what, describe(n))
	}
	pairs := make([]pair, 0, len(n.Content)/2)
	first := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" {
			what := describe(k)
			if k.Tag == "!!merge" {
				what = "the merge key <<"
			}
			return nil, p.errAt(k, path, "field names must be plain strings, not %s", what)
		}
		if prev, ok := first[k.Value]; ok {
			return nil, p.errAt(k, join(path, k.Value), "repeated (first at line %d)", prev.Line)
		}
		first[k.Value] = k
		pairs = append(pairs, pair{key: k.Value, keyNode: k, val: v})
	}
	return pairs, nil
}

func (p *parser) unknown(kv pair, path, known string) error {
	return p.errAt(kv.keyNode, join(path, kv.key), "unknown field (want %s)", known)
}

func (p *parser) str(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return "", p.errAt(n, field, "must be a string, not %s", describe(n))
	}
	return n.Value, nil
}

// name reads a rule name: any scalar but null and booleans, taken as
// written (so `name: 404` is the name "404").
func (p *parser) name(n *yaml.Node, field string) (string, error) {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || n.Tag == "!!bool" {
		return "", p.errAt(n, field, "must be a string, not %s", describe(n))
	}
	if err := bucket.ValidateKey(n.Value, "x"); err != nil {
		return "", p.errAt(n, field, "%v", err)
	}
	return n.Value, nil
}

func (p *parser) intIn(n *yaml.Node, field string, lo, hi int64) (int64, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		return 0, p.errAt(n, field, "must be an integer, not %s", describe(n))
	}
	var v int64
	if err := n.Decode(&v); err != nil {
		return 0, p.errAt(n, field, "%q is not in %d..%d", n.Value, lo, hi)
	}
	if v < lo || v > hi {
		return 0, p.errAt(n, field, "%d is not in %d..%d", v, lo, hi)
	}
	return v, nil
}

func (p *parser) bool(n *yaml.Node, field string) (bool, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		return false, p.errAt(n, field, "must be true or false, not %s", describe(n))
	}
	var v bool
	if err := n.Decode(&v); err != nil {
		return false, p.errAt(n, field, "must be true or false, not %s", describe(n))
	}
	return v, nil
}

func (p *parser) window(n *yaml.Node, field string) (int64, error) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return 0, p.errAt(n, field, "must be a duration with a unit (like 500ms, 1m, 1h30m, 7d), not %s", describe(n))
	}
	ms, err := ParseWindow(n.Value)
	if err != nil {
		return 0, p.errAt(n, field, "%v", err)
	}
	return ms, nil
}

// ParseWindow parses a window: a Go duration ("500ms", "1m", "1h30m") with
// an optional leading whole number of days ("1d", "7d", "1d12h"). The
// window must be a whole number of milliseconds in 1ms..366d; the result
// is in milliseconds.
func ParseWindow(s string) (int64, error) {
	const day = 24 * time.Hour
	const maxWindow = time.Duration(bucket.MaxWindowMS) * time.Millisecond
	bad := fmt.Errorf("%q is not a duration (like 500ms, 1m, 1h30m, 7d)", s)
	var d time.Duration
	rest := s
	if i := strings.IndexByte(s, 'd'); i >= 0 {
		days, err := strconv.ParseUint(s[:i], 10, 16)
		if err != nil || s[0] == '+' {
			return 0, bad
		}
		if days > 366 {
			return 0, fmt.Errorf("%q is not 1ms..366d", s)
		}
		d, rest = time.Duration(days)*day, s[i+1:]
		if rest == "" {
			rest = "0s"
		} else if rest[0] == '-' || rest[0] == '+' {
			return 0, bad
		}
	}
	r, err := time.ParseDuration(rest)
	if err != nil {
		return 0, bad
	}
	if r > maxWindow || r < -maxWindow {
		return 0, fmt.Errorf("%q is not 1ms..366d", s)
	}
	d += r
	if d < time.Millisecond || d > maxWindow {
		return 0, fmt.Errorf("%q is not 1ms..366d", s)
	}
	if d%time.Millisecond != 0 {
		return 0, fmt.Errorf("%q is not a whole number of milliseconds", s)
	}
	return d.Milliseconds(), nil
}

// resolve follows aliases to the node they name.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n.Kind == yaml.AliasNode && n.Alias != nil && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// describe names a node's kind for error messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return strconv.Quote(n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}
