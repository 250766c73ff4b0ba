package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/ring"
)

// yamlLine matches the line of a yaml.v3 syntax error.
var yamlLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// The serve configuration comes in layers: a flag on the command line wins,
// then its SLUICE_* environment variable, then the key of the same name in
// the --config file, then the default. The file is a YAML mapping whose
// keys are the flag names (grpc-addr: 127.0.0.1:8081).
//
// This is the hand-written overlay every subcommand already uses
// (parseWithEnv) grown by one layer, rather than a flag library such as
// peterbourgon/ff: the standard flag package keeps the usage text and the
// flag definitions as they are, the YAML parser is the one the rules files
// use (go.yaml.in/yaml/v3, whose nodes carry line and column, so every
// refusal says file:line:col), and a value's type is checked against its
// flag's type instead of being turned into a string first.

// configFlag is the flag of serve naming the file; SLUICE_CONFIG also sets it.
const configFlag = "config"

// envName is the environment variable of the flag name.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// configValue is one key of a config file, checked against its flag.
type configValue struct {
	key, value string
	pos        string // file:line:col of the value
}

// sources records where each flag's value came from, for error messages:
// "--name" (command line), "SLUICE_NAME=value" (environment) or
// "file:line:col: name" (config file); a flag left at its default has none.
type sources map[string]string

// describe names the origin of flag's value in an error message.
func (s sources) describe(name string) string {
	if src, ok := s[name]; ok {
		return src
	}
	return "--" + name + " (default)"
}

// parseLayered parses args into fs, then fills every flag not on the
// command line from its environment variable (lookupEnv), and the flags
// neither sets from the config file named by the config flag (read with
// readFile), if fs has one and it is set. The layers are applied from the
// lowest up (file, environment, command line), each value through its
// flag's Set. Errors say where the bad value is.
func parseLayered(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool), readFile func(string) ([]byte, error)) (sources, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	src := sources{}
	fs.Visit(func(f *flag.Flag) { src[f.Name] = "--" + f.Name })
	if cf := fs.Lookup(configFlag); cf != nil {
		path, from := cf.Value.String(), "--"+configFlag
		if src[configFlag] == "" {
			path, _ = lookupEnv(envName(configFlag))
			from = envName(configFlag)
		}
		if path != "" {
			data, err := readFile(path)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", from, err)
			}
			vals, err := parseConfig(path, data, fs)
			if err != nil {
				return nil, err
			}
			for _, v := range vals {
				if src[v.key] == "" {
					src[v.key] = v.pos + ": " + v.key
				}
			}
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := envName(f.Name)
		if v, ok := lookupEnv(env); ok && !strings.HasPrefix(src[f.Name], "--") && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
			src[f.Name] = fmt.Sprintf("%s=%q", env, v)
		}
	})
	if err != nil {
		return nil, err
	}
	// The file may have set flags that are also on the command line: the
	// command line is applied again, last.
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return src, nil
}

// parseConfig reads a config file's YAML (name is for messages) and sets
// each key's flag in fs to its value. A key must name a flag (not config
// itself) and appear once; its value must have the flag's type (a string,
// a whole number, true or false, a duration with a unit) and be accepted by
// the flag; join also takes a list of addresses. The first key that breaks
// a rule is refused with its file:line:col.
func parseConfig(name string, data []byte, fs *flag.FlagSet) ([]configValue, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		// "yaml: line 3: mapping values are not allowed" as file:3: ...
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			return nil, fmt.Errorf("%s:%s: %s", name, m[1], m[2])
		}
		return nil, fmt.Errorf("%s: %s", name, msg)
	}
	if len(doc.Content) == 0 {
		return nil, nil // empty file: nothing set
	}
	root := doc.Content[0]
	at := func(n *yaml.Node) string { return fmt.Sprintf("%s:%d:%d", name, n.Line, n.Column) }
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: want a mapping of flag names to values (grpc-addr: 127.0.0.1:8081), got %s", at(root), kindName(root))
	}
	seen := map[string]*yaml.Node{}
	var out []configValue
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode || k.Tag != "!!str" {
			return nil, fmt.Errorf("%s: want a flag name as key, got %s", at(k), kindName(k))
		}
		key := k.Value
		f := fs.Lookup(key)
		switch {
		case key == configFlag:
			return nil, fmt.Errorf("%s: %s: a config file cannot name another one", at(k), key)
		case f == nil:
			msg := fmt.Sprintf("%s: unknown key %q: keys are the flags of sluice serve (sluice serve -h)", at(k), key)
			if alt := strings.ToLower(strings.ReplaceAll(key, "_", "-")); alt != key && fs.Lookup(alt) != nil {
				msg = fmt.Sprintf("%s: unknown key %q: did you mean %q?", at(k), key, alt)
			}
			return nil, errors.New(msg)
		case seen[key] != nil:
			return nil, fmt.Errorf("%s: %s: given twice (first at line %d)", at(k), key, seen[key].Line)
		}
		seen[key] = k
		val, err := configScalar(key, v, f.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", at(v), key, err)
		}
		if err := fs.Set(key, val); err != nil {
			return nil, fmt.Errorf("%s: %s: invalid value %q: %w", at(v), key, val, err)
		}
		out = append(out, configValue{key: key, value: val, pos: at(v)})
	}
	return out, nil
}

// configScalar returns the flag text of YAML value v for the flag whose
// value is fv, refusing a value of another type than the flag's.
func configScalar(key string, v *yaml.Node, fv flag.Value) (string, error) {
	if v.Kind == yaml.SequenceNode && key == "join" {
		parts := make([]string, 0, len(v.Content))
		for _, e := range v.Content {
			if e.Kind != yaml.ScalarNode || e.Tag != "!!str" || strings.Contains(e.Value, ",") {
				return "", fmt.Errorf("want a list of host:port strings, item at line %d col %d is %s", e.Line, e.Column, kindName(e))
			}
			parts = append(parts, e.Value)
		}
		return strings.Join(parts, ","), nil
	}
	if v.Kind == yaml.AliasNode {
		return "", errors.New("aliases are not supported: write the value")
	}
	if v.Kind != yaml.ScalarNode {
		return "", fmt.Errorf("want %s, got %s", flagType(key, fv), kindName(v))
	}
	if v.Tag == "!!null" {
		return "", fmt.Errorf("no value: want %s (write \"\" for an empty string)", flagType(key, fv))
	}
	var ok bool
	switch want := flagType(key, fv); want {
	case "a string":
		ok = v.Tag == "!!str"
	case "true or false":
		ok = v.Tag == "!!bool"
	case "a whole number":
		ok = v.Tag == "!!int"
	case "a number":
		ok = v.Tag == "!!int" || v.Tag == "!!float"
	case "a duration with a unit (250ms, 1s, 2m)":
		ok = v.Tag == "!!str" // a bare number has no unit: refused
	default: // a size: 67108864 or "64MiB"
		ok = v.Tag == "!!int" || v.Tag == "!!str"
	}
	if !ok {
		return "", fmt.Errorf("want %s, got %s %s", flagType(key, fv), kindName(v), v.Value)
	}
	return v.Value, nil
}

// flagType describes the YAML type a flag takes, from its value's Go type.
func flagType(key string, fv flag.Value) string {
	g, ok := fv.(flag.Getter)
	if !ok {
		return "a size in bytes (64MiB)"
	}
	switch g.Get().(type) {
	case bool:
		return "true or false"
	case int, int64, uint, uint64:
		return "a whole number"
	case float64:
		return "a number"
	case time.Duration:
		return "a duration with a unit (250ms, 1s, 2m)"
	}
	if key == "join" {
		return "a string or a list of host:port strings"
	}
	return "a string"
}

// kindName names a YAML node's kind (and a scalar's type) for messages.
func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			return "a string"
		case "!!int":
			return "a number"
		case "!!float":
			return "a decimal number"
		case "!!bool":
			return "a boolean"
		case "!!null":
			return "null"
		}
		return "a " + strings.TrimPrefix(n.Tag, "!!")
	}
	return "nothing"
}

// validate checks the values serve can check before it starts anything,
// returning the name of the first flag whose value is refused.
func (f *serveFlags) validate() (string, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(f.logLevel)); err != nil {
		return "log-level", fmt.Errorf("%q: want debug, info, warn or error", f.logLevel)
	}
	if f.logFormat != "text" && f.logFormat != "json" {
		return "log-format", fmt.Errorf("%q: want text or json", f.logFormat)
	}
	if _, err := cluster.ParseOwnerUnavailable(f.onOwnerUnavailable); err != nil {
		return "on-owner-unavailable", err
	}
	if f.nodeName == "" {
		return "node-name", errors.New("empty: every node needs a unique name")
	}
	for _, a := range []struct{ name, v string }{{"grpc-addr", f.grpcAddr}, {"http-addr", f.httpAddr}, {"gossip-addr", f.gossipAddr}} {
		if a.v == "" && a.name == "http-addr" {
			continue // empty disables HTTP
		}
		if _, _, err := splitHostPort(a.v); err != nil {
			return a.name, fmt.Errorf("%q: want host:port: %v", a.v, err)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"join-retry", f.joinRetry}, {"rules-interval", f.rulesInterval}, {"flush-interval", f.flushInterval},
		{"replication-interval", f.replicationInterval}, {"move-window", f.moveWindow},
		{"forward-timeout", f.forwardTimeout}, {"shutdown-timeout", f.shutdownTimeout}, {"secrets-interval", f.secretsInterval},
	} {
		if d.v <= 0 {
			return d.name, fmt.Errorf("%v: want a positive duration", d.v)
		}
	}
	if f.heartbeatIdle < 0 {
		return "heartbeat-idle", fmt.Errorf("%v: want a duration of 0 (beat always) or more", f.heartbeatIdle)
	}
	if t := f.hotKeyThreshold; !(t >= 0) || math.IsInf(t, 1) {
		return "hot-key-threshold", fmt.Errorf("%v: want a number of hits per second, 0 (no leases) or more", t)
	}
	if f.cacheSize < 1 {
		return "cache-size", fmt.Errorf("%d: want at least 1", f.cacheSize)
	}
	if f.cacheCopies < 0 {
		return "cache-copies", fmt.Errorf("%d: want 0 or more", f.cacheCopies)
	}
	if f.replicas < 1 || f.replicas > ring.MaxReplicationFactor {
		return "replicas", fmt.Errorf("%d: want 1..%d", f.replicas, ring.MaxReplicationFactor)
	}
	if d := f.failureDetection; d != "lan" && d != "fast" {
		return "failure-detection", fmt.Errorf("%q: want lan or fast", d)
	}
	if p := f.ringPartitions; p < 1 || p > ring.MaxPartitions {
		return "ring-partitions", fmt.Errorf("%d: want 1..%d", p, ring.MaxPartitions)
	}
	if l := f.ringLoad; !(l > 1 && l <= ring.MaxLoad) {
		return "ring-load", fmt.Errorf("%v: want more than 1 and at most %v", l, ring.MaxLoad)
	}
	if s := f.forwardAuthDenyStatus; s < 400 || s > 499 {
		return "forward-auth-deny-status", fmt.Errorf("%d: want 400..499", s)
	}
	return "", nil
}
