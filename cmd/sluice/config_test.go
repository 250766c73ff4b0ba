package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// layers runs parseLayered over serve's flags with env as the environment
// and files as the file system.
func layers(args []string, env, files map[string]string) (*serveFlags, sources, error) {
	var f serveFlags
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	read := func(name string) ([]byte, error) {
		d, ok := files[name]
		if !ok {
			return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
		}
		return []byte(d), nil
	}
	src, err := parseLayered(newServeFlagSet(&f), args, lookup, read)
	return &f, src, err
}

func TestConfigFilePrecedence(t *testing.T) {
	t.Parallel()
	file := `# every layer below sets some of these
node-name: from-file
grpc-addr: 127.0.0.1:9001
http-addr: 127.0.0.1:9002
cache-size: 5000
flush-interval: 3s
pprof: true
join:
  - 10.0.0.1:7946
  - 10.0.0.2:7946
gc-min-heap: 32MiB
hot-key-threshold: 50.5
`
	env := map[string]string{"SLUICE_HTTP_ADDR": "127.0.0.1:9102", "SLUICE_NODE_NAME": "from-env", "SLUICE_CACHE_SIZE": "7000"}
	args := []string{"--config", "s.yaml", "--node-name", "from-flag", "--cache-size", "9000"}
	f, src, err := layers(args, env, map[string]string{"s.yaml": file})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, got, want, src string }{
		{"node-name (flag > env > file)", f.nodeName, "from-flag", "--node-name"},
		{"cache-size (flag > env > file)", itoa(f.cacheSize), "9000", "--cache-size"},
		{"http-addr (env > file)", f.httpAddr, "127.0.0.1:9102", `SLUICE_HTTP_ADDR="127.0.0.1:9102"`},
		{"grpc-addr (file)", f.grpcAddr, "127.0.0.1:9001", "s.yaml:3:12: grpc-addr"},
		{"flush-interval (file)", f.flushInterval.String(), "3s", "s.yaml:6:17: flush-interval"},
		{"pprof (file)", strconv.FormatBool(f.pprof), "true", "s.yaml:7:8: pprof"},
		{"join (file, a list)", f.join, "10.0.0.1:7946,10.0.0.2:7946", "s.yaml:9:3: join"},
		{"gc-min-heap (file)", f.gcMinHeap.String(), "32MiB", "s.yaml:11:14: gc-min-heap"},
		{"hot-key-threshold (file, a decimal number)", strconv.FormatFloat(f.hotKeyThreshold, 'g', -1, 64), "50.5", "s.yaml:12:20: hot-key-threshold"},
		{"gossip-addr (default)", f.gossipAddr, ":7946", ""},
	} {
		name := strings.Fields(c.what)[0]
		if c.got != c.want || src[name] != c.src {
			t.Errorf("%s: %q from %q, want %q from %q", c.what, c.got, src[name], c.want, c.src)
		}
	}

	// SLUICE_CONFIG names the file when --config does not; --config wins.
	f, _, err = layers(nil, map[string]string{"SLUICE_CONFIG": "a.yaml"}, map[string]string{"a.yaml": "node-name: a\n", "b.yaml": "node-name: b\n"})
	if err != nil || f.nodeName != "a" {
		t.Errorf("SLUICE_CONFIG=a.yaml: node name %q, error %v; want a", f.nodeName, err)
	}
	f, _, err = layers([]string{"--config", "b.yaml"}, map[string]string{"SLUICE_CONFIG": "a.yaml"}, map[string]string{"a.yaml": "node-name: a\n", "b.yaml": "node-name: b\n"})
	if err != nil || f.nodeName != "b" {
		t.Errorf("--config b.yaml with SLUICE_CONFIG=a.yaml: node name %q, error %v; want b", f.nodeName, err)
	}
	// An empty file (or only comments) sets nothing.
	f, _, err = layers([]string{"--config", "e.yaml"}, nil, map[string]string{"e.yaml": "# nothing yet\n"})
	if err != nil || f.grpcAddr != ":8081" {
		t.Errorf("empty file: grpc addr %q, error %v; want the default", f.grpcAddr, err)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestConfigFileErrors: every class of mistake is refused with the place
// and the key, and what was wrong.
func TestConfigFileErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		what, file string
		want       []string // substrings of the error
	}{
		{"syntax", "grpc-addr: a\n  b: c\n", []string{"c.yaml:2: ", "mapping values are not allowed"}},
		{"not a mapping", "- grpc-addr\n", []string{"c.yaml:1:1: ", "want a mapping", "got a list"}},
		{"unknown key", "grpc-addr: :1\nlisten: :2\n", []string{"c.yaml:2:1: ", `unknown key "listen"`}},
		{"unknown key, a likely spelling", "grpc_addr: :1\n", []string{"c.yaml:1:1: ", `did you mean "grpc-addr"`}},
		{"config in config", "config: other.yaml\n", []string{"c.yaml:1:1: ", "cannot name another"}},
		{"duplicate", "replicas: 2\nreplicas: 3\n", []string{"c.yaml:2:1: replicas: given twice (first at line 1)"}},
		{"no value", "grpc-addr:\n", []string{"c.yaml:1:11: grpc-addr: no value"}},
		{"number for a string", "node-name: 42\n", []string{"c.yaml:1:12: node-name: want a string, got a number 42"}},
		{"string for a number", "cache-size: lots\n", []string{"c.yaml:1:13: cache-size: want a whole number, got a string lots"}},
		{"decimal for a number", "cache-size: 1.5\n", []string{"c.yaml:1:13: cache-size: want a whole number"}},
		{"string for a boolean", "pprof: yes please\n", []string{"c.yaml:1:8: pprof: want true or false"}},
		{"duration without a unit", "flush-interval: 5\n", []string{"c.yaml:1:17: flush-interval: want a duration with a unit"}},
		{"mapping for a string", "data-dir:\n  path: /x\n", []string{"c.yaml:2:3: data-dir: want a string, got a mapping"}},
		{"list for a string", "data-dir: [a, b]\n", []string{"c.yaml:1:11: data-dir: want a string, got a list"}},
		{"list item not a string", "join: [10.0.0.1:7946, 7]\n", []string{"c.yaml:1:7: join: ", "is a number"}},
		{"bad duration", "flush-interval: soon\n", []string{"c.yaml:1:17: flush-interval: invalid value \"soon\""}},
		{"bad size", "gc-min-heap: lots\n", []string{"c.yaml:1:14: gc-min-heap: invalid value \"lots\""}},
		{"number out of range", "cache-size: 99999999999999999999\n", []string{"c.yaml:1:13: cache-size: want a whole number, got a decimal number"}},
	} {
		_, _, err := layers([]string{"--config", "c.yaml"}, nil, map[string]string{"c.yaml": tc.file})
		if err == nil {
			t.Errorf("%s: %q accepted", tc.what, tc.file)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", tc.what, err, w)
			}
		}
	}
	if _, _, err := layers([]string{"--config", "missing.yaml"}, nil, nil); err == nil || !strings.Contains(err.Error(), "--config: open missing.yaml") {
		t.Errorf("missing file: %v, want an error naming --config and the file", err)
	}
	if _, _, err := layers(nil, map[string]string{"SLUICE_CONFIG": "missing.yaml"}, nil); err == nil || !strings.Contains(err.Error(), "SLUICE_CONFIG: open missing.yaml") {
		t.Errorf("missing file from SLUICE_CONFIG: %v, want an error naming the variable", err)
	}
}

// TestServeRefusesABadConfig runs `sluice serve` with bad files: exit
// status 2, the place in the message, and nothing started (no data
// directory, the ports still free).
func TestServeRefusesABadConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := l.Addr().String()
	l.Close()
	dataDir := filepath.Join(dir, "data")
	base := "node-name: n1\ngrpc-addr: " + grpcAddr + "\nhttp-addr: \"\"\ngossip-addr: 127.0.0.1:0\ndata-dir: " + dataDir + "\n"
	for _, tc := range []struct{ what, extra, env, want string }{
		{"unknown key", "colour: blue\n", "", "c.yaml:6:1: unknown key \"colour\""},
		{"wrong type", "replicas: two\n", "", "c.yaml:6:11: replicas: want a whole number"},
		{"bad value", "log-level: loud\n", "", `c.yaml:6:12: log-level: "loud": want debug, info, warn or error`},
		{"bad value", "on-owner-unavailable: shrug\n", "", "c.yaml:6:23: on-owner-unavailable: "},
		{"bad value", "forward-auth-deny-status: 503\n", "", "c.yaml:6:27: forward-auth-deny-status: 503: want 400..499"},
		{"bad value", "forward-timeout: -1s\n", "", "c.yaml:6:18: forward-timeout: -1s: want a positive duration"},
		{"bad value", "hot-key-threshold: -5\n", "", "c.yaml:6:20: hot-key-threshold: -5: want a number of hits per second"},
		{"bad value", "hot-key-threshold: .inf\n", "", "c.yaml:6:20: hot-key-threshold: invalid value \".inf\""},
		{"wrong type", "hot-key-threshold: many\n", "", "c.yaml:6:20: hot-key-threshold: want a number, got a string many"},
		{"bad value", "failure-detection: quick\n", "", `c.yaml:6:20: failure-detection: "quick": want lan or fast`},
		{"bad value", "ring-partitions: 0\n", "", "c.yaml:6:18: ring-partitions: 0: want 1..1048576"},
		{"bad value", "cache-copies: -1\n", "", "c.yaml:6:15: cache-copies: -1: want 0 or more"},
		{"bad value", "ring-load: 1\n", "", "c.yaml:6:12: ring-load: 1: want more than 1 and at most 10"},
		{"bad address", "gossip-addr: nowhere\n", "", "c.yaml:5:14: gossip-addr: \"nowhere\": want host:port"},
	} {
		path := filepath.Join(dir, "c.yaml")
		body := base
		if strings.HasPrefix(tc.extra, "gossip-addr") {
			body = strings.Replace(base, "gossip-addr: 127.0.0.1:0\n", "", 1)
		}
		if err := os.WriteFile(path, []byte(body+tc.extra), 0o600); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		code := run(context.Background(), []string{"serve", "--config", path}, &bytes.Buffer{}, &stderr)
		msg := strings.ReplaceAll(stderr.String(), dir+"/", "")
		if code != 2 || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", tc.what, code, msg, tc.want)
		}
		if _, err := os.Stat(dataDir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: the data directory exists (%v): something started", tc.what, err)
		}
		if l, err := net.Listen("tcp", grpcAddr); err != nil {
			t.Errorf("%s: gRPC port %s taken after a refused start: %v", tc.what, grpcAddr, err)
		} else {
			l.Close()
		}
	}
}

// posRE is the file:line: (and optional col:) of an error from parseConfig.
var posRE = regexp.MustCompile(`^f\.yaml:\d+:(\d+: )?`)

// FuzzConfigFile: parseConfig never panics, every refusal starts with the
// file's name and a line, and what it accepts sets only serve's flags, to
// values their flags take again.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{
		"grpc-addr: 127.0.0.1:8081\nreplicas: 3\n",
		"join:\n  - a:1\n  - b:2\npprof: true\nflush-interval: 2s\ngc-min-heap: 64MiB\n",
		"cache-size: 12\nnode-name: \"x\"\n",
		"- a\n", "a: [\n", "x: &a 1\ny: *a\n", "{}", "", "node-name: !!binary aGVsbG8=\n",
		"data-dir: ~\n", "? [a]\n: b\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var sf serveFlags
		vals, err := parseConfig("f.yaml", data, newServeFlagSet(&sf))
		if err != nil {
			if !posRE.MatchString(err.Error()) && !strings.HasPrefix(err.Error(), "f.yaml: ") {
				t.Fatalf("error without the file's place: %q", err)
			}
			return
		}
		check := newServeFlagSet(&serveFlags{})
		for _, v := range vals {
			if v.key == configFlag || check.Lookup(v.key) == nil {
				t.Fatalf("accepted key %q, which is not a flag of serve", v.key)
			}
			if err := check.Set(v.key, v.value); err != nil {
				t.Fatalf("accepted %s: %q, which its flag refuses: %v", v.key, v.value, err)
			}
			if !posRE.MatchString(v.pos + ": ") {
				t.Fatalf("position %q", v.pos)
			}
		}
	})
}

// TestExampleConfigFile keeps deploy/examples/sluice.yaml valid: every key
// parses, and the values pass serve's checks.
func TestExampleConfigFile(t *testing.T) {
	t.Parallel()
	const path = "../../deploy/examples/sluice.yaml"
	f, src, err := layers([]string{"--config", path}, nil, map[string]string{path: mustRead(t, path)})
	if err != nil {
		t.Fatal(err)
	}
	if name, err := f.validate(); err != nil {
		t.Fatalf("%s: %v", src.describe(name), err)
	}
	if f.nodeName != "sluice-a" || f.join != "10.0.0.11:7946,10.0.0.12:7946,10.0.0.13:7946" || f.logFormat != "json" {
		t.Errorf("node name %q, join %q, log format %q: not the file's", f.nodeName, f.join, f.logFormat)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseRegionJoin(t *testing.T) {
	t.Parallel()
	m, err := parseRegionJoin("us@10.0.0.1:8081, us@10.0.0.2:8081,eu@[::1]:8081")
	if err != nil || len(m["us"]) != 2 || m["eu"][0] != "[::1]:8081" {
		t.Fatalf("%v, %v", m, err)
	}
	for _, bad := range []string{"10.0.0.1:8081", "@10.0.0.1:8081", "us@10.0.0.1", "us@"} {
		if _, err := parseRegionJoin(bad); err == nil || !strings.Contains(err.Error(), "REGION@host:port") {
			t.Errorf("%q: %v, want an error naming the form", bad, err)
		}
	}
	if m, err := parseRegionJoin(""); m != nil || err != nil {
		t.Errorf("empty: %v, %v", m, err)
	}
}

// A node with neither TLS nor a gossip key trusts every caller that
// reaches it, so the addresses nobody set listen on loopback only; set
// ones are kept, and a secured node keeps the every-interface defaults.
func TestInsecureNodeListensOnLoopbackByDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		what               string
		args               []string
		env, files         map[string]string
		grpc, http, gossip string
		moved              string
	}{
		{"nothing set", nil, nil, nil, "127.0.0.1:8081", "127.0.0.1:8080", "127.0.0.1:7946", "grpc-addr,http-addr,gossip-addr"},
		{"gRPC on the command line", []string{"--grpc-addr", ":9081"}, nil, nil, ":9081", "127.0.0.1:8080", "127.0.0.1:7946", "http-addr,gossip-addr"},
		{"HTTP off in the environment", nil, map[string]string{"SLUICE_HTTP_ADDR": ""}, nil, "127.0.0.1:8081", "", "127.0.0.1:7946", "grpc-addr,gossip-addr"},
		{"gossip in the file", []string{"--config", "s.yaml"}, nil, map[string]string{"s.yaml": "gossip-addr: 0.0.0.0:7946\n"}, "127.0.0.1:8081", "127.0.0.1:8080", "0.0.0.0:7946", "grpc-addr,http-addr"},
		{"gossip key", []string{"--gossip-key-file", "k"}, nil, nil, ":8081", ":8080", ":7946", ""},
		{"TLS", []string{"--tls-cert", "c", "--tls-key", "k", "--tls-ca", "ca"}, nil, nil, ":8081", ":8080", ":7946", ""},
	} {
		f, src, err := layers(c.args, c.env, c.files)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		moved := strings.Join(f.loopbackUnlessSecured(src), ",")
		if f.grpcAddr != c.grpc || f.httpAddr != c.http || f.gossipAddr != c.gossip || moved != c.moved {
			t.Errorf("%s: grpc %q http %q gossip %q, moved %q; want %q %q %q, moved %q",
				c.what, f.grpcAddr, f.httpAddr, f.gossipAddr, moved, c.grpc, c.http, c.gossip, c.moved)
		}
	}
}
