package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	_ "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3" // registers the RLS types
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health/grpc_health_v1" // registers the health types
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// apiDocsRules are the rules the node of docs/api.md's examples runs with.
const apiDocsRules = `rules:
- name: login
  limits: [{limit: 3, window: 1h}]
`

// docExample is one command of a ```console block of a doc and the output
// shown under it.
type docExample struct {
	line int // of the command in the doc
	args []string
	out  string
}

// consoleExamples returns the commands of the ```console blocks of a
// Markdown file: a line "$ cmd" (continued by a trailing backslash), then
// its output up to the next "$ " line or the end of the block.
func consoleExamples(t *testing.T, path string) []docExample {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		exs     []docExample
		in      bool
		cur     *docExample
		cmd     strings.Builder
		cmdLine int
	)
	flush := func() {
		if cur != nil {
			cur.out = strings.TrimRight(cur.out, "\n")
			exs = append(exs, *cur)
			cur = nil
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case !in && strings.TrimSpace(l) == "```console":
			in = true
			continue
		case in && strings.TrimSpace(l) == "```":
			flush()
			in = false
			continue
		case !in:
			continue
		}
		if cmd.Len() > 0 || strings.HasPrefix(l, "$ ") {
			if cmd.Len() == 0 {
				flush()
				cmdLine = n
				l = strings.TrimPrefix(l, "$ ")
			}
			if s, ok := strings.CutSuffix(l, `\`); ok {
				cmd.WriteString(s)
				continue
			}
			cmd.WriteString(l)
			args, err := shellWords(cmd.String())
			if errors.Is(err, errUnclosed) { // a quoted word goes on
				cmd.WriteByte('\n')
				continue
			}
			if err != nil {
				t.Fatalf("%s:%d: %v", path, cmdLine, err)
			}
			cur = &docExample{line: cmdLine, args: args}
			cmd.Reset()
			continue
		}
		if cur != nil {
			cur.out += l + "\n"
		}
	}
	if in {
		t.Fatalf("%s: a ```console block is not closed", path)
	}
	return exs
}

var errUnclosed = errors.New("unclosed quote")

// shellWords splits s as a POSIX shell would for the commands of the docs:
// words separated by spaces, single and double quotes (with \" and \\ in
// double quotes). No variables or globs.
func shellWords(s string) ([]string, error) {
	var (
		words []string
		w     strings.Builder
		has   bool
	)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t':
			if has {
				words, has = append(words, w.String()), false
				w.Reset()
			}
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, errUnclosed
			}
			w.WriteString(s[i+1 : i+1+j])
			i, has = i+1+j, true
		case '"':
			i++
			for ; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\') {
					i++
				}
				w.WriteByte(s[i])
			}
			if i == len(s) {
				return nil, errUnclosed
			}
			has = true
		default:
			w.WriteByte(c)
			has = true
		}
	}
	if has {
		words = append(words, w.String())
	}
	return words, nil
}

// The fields whose values depend on the clock, the ports, the ring or the
// node's recent load: left out of the comparison.
var volatileFields = map[string]bool{
	"reset_after_ms": true, "resetAfterMs": true, "retry_after_ms": true, "retryAfterMs": true,
	"durationUntilReset": true, "grpcAddr": true, "grpc_addr": true, "checksPerSecond": true,
	"unixMs": true, "version": true, "versions": true, "owners": true, "hash": true, "unflushed": true, "unreplicated": true,
}

var msLeft = regexp.MustCompile(`for [0-9]+ ms more`)

// sameJSON compares two JSON documents as values, without their volatile
// fields.
func sameJSON(want, got string) (bool, error) {
	parse := func(s string) (any, error) {
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return nil, err
		}
		if d.More() {
			return nil, fmt.Errorf("more than one JSON value")
		}
		return mask(v), nil
	}
	w, err := parse(want)
	if err != nil {
		return false, fmt.Errorf("the doc's JSON: %v", err)
	}
	g, err := parse(got)
	if err != nil {
		return false, fmt.Errorf("the answer's JSON: %v", err)
	}
	return reflect.DeepEqual(w, g), nil
}

func mask(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			switch {
			case volatileFields[k]:
				delete(v, k)
			case k == "error":
				// An algorithm conflict says how long the key's count has
				// left, which depends on the clock.
				if s, ok := e.(string); ok {
					v[k] = msLeft.ReplaceAllString(s, "for N ms more")
				}
			default:
				v[k] = mask(e)
			}
		}
	case []any:
		for i := range v {
			v[i] = mask(v[i])
		}
	}
	return v
}

// sameText compares a text body: exactly, or, when the doc's shows a line
// "...", its other lines must appear in this order among the answer's.
func sameText(want, got string) bool {
	want, got = strings.TrimRight(want, "\n"), strings.TrimRight(got, "\n")
	if !strings.Contains("\n"+want+"\n", "\n...\n") {
		return want == got
	}
	lines := strings.Split(got, "\n")
	for _, w := range strings.Split(want, "\n") {
		if w == "..." {
			continue
		}
		for len(lines) > 0 && lines[0] != w {
			lines = lines[1:]
		}
		if len(lines) == 0 {
			return false
		}
		lines = lines[1:]
	}
	return true
}

var rateLimitReset = regexp.MustCompile(`;t=\d+`)

// runCurl runs a curl command of the docs against the node at httpAddr and
// compares its answer with the output shown.
func runCurl(t *testing.T, ex docExample, httpAddr string) {
	t.Helper()
	method, body, url, include := "GET", "", "", false
	hdr := http.Header{}
	for i := 1; i < len(ex.args); i++ {
		switch a := ex.args[i]; {
		case a == "-s":
		case a == "-i" || a == "-si":
			include = true
		case a == "-X" && i+1 < len(ex.args):
			i++
			method = ex.args[i]
		case a == "-H" && i+1 < len(ex.args):
			i++
			k, v, _ := strings.Cut(ex.args[i], ":")
			hdr.Add(k, strings.TrimSpace(v))
		case a == "-d" && i+1 < len(ex.args):
			i++
			body = ex.args[i]
			if method == "GET" {
				method = "POST"
			}
		case strings.HasPrefix(a, "localhost:8080/"):
			url = "http://" + httpAddr + strings.TrimPrefix(a, "localhost:8080")
		default:
			t.Fatalf("line %d: curl argument %q is not one the test knows", ex.line, a)
		}
	}
	if url == "" {
		t.Fatalf("line %d: no localhost:8080 URL", ex.line)
	}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = hdr
	if body != "" && hdr.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as curl -d sends
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("line %d: %v", ex.line, err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	want := ex.out
	if include {
		head, rest, _ := strings.Cut(want, "\n\n")
		want = rest
		lines := strings.Split(head, "\n")
		var code int
		if _, err := fmt.Sscanf(lines[0], "HTTP/1.1 %d", &code); err != nil {
			t.Fatalf("line %d: status line %q", ex.line, lines[0])
		}
		if resp.StatusCode != code {
			t.Errorf("line %d: %s %s answered %d, the doc says %d: %s", ex.line, method, url, resp.StatusCode, code, got)
		}
		for _, h := range lines[1:] {
			k, v, _ := strings.Cut(h, ":")
			g := resp.Header.Get(k)
			v = strings.TrimSpace(v)
			if k == "RateLimit" {
				g, v = rateLimitReset.ReplaceAllString(g, ";t=N"), rateLimitReset.ReplaceAllString(v, ";t=N")
			}
			if g != v {
				t.Errorf("line %d: header %s is %q, the doc says %q", ex.line, k, g, v)
			}
		}
	}
	if strings.HasPrefix(strings.TrimSpace(want), "{") {
		if ok, err := sameJSON(want, string(got)); err != nil || !ok {
			t.Errorf("line %d: answered\n%s\nthe doc says\n%s\n%v", ex.line, got, want, err)
		}
	} else if !sameText(want, string(got)) {
		t.Errorf("line %d: answered\n%s\nthe doc says\n%s", ex.line, got, want)
	}
}

// runGRPCurl runs a grpcurl command of the docs (grpcurl -plaintext [-d
// JSON] localhost:8081 service/Method) with the Go client on the node at
// grpcAddr, and compares the answer with the output shown, printed as
// grpcurl does (protojson, lowerCamel names, default values left out; an
// error as "ERROR:", "  Code: ...", "  Message: ...").
func runGRPCurl(t *testing.T, ex docExample, cc *grpc.ClientConn) {
	t.Helper()
	var data, method string
	for i := 1; i < len(ex.args); i++ {
		switch a := ex.args[i]; {
		case a == "-plaintext":
		case a == "-d" && i+1 < len(ex.args):
			i++
			data = ex.args[i]
		case a == "localhost:8081":
		case strings.Contains(a, "/") && method == "":
			method = a
		default:
			t.Fatalf("line %d: grpcurl argument %q is not one the test knows", ex.line, a)
		}
	}
	svc, name, _ := strings.Cut(method, "/")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		t.Fatalf("line %d: service %s: %v", ex.line, svc, err)
	}
	md := d.(protoreflect.ServiceDescriptor).Methods().ByName(protoreflect.Name(name))
	if md == nil {
		t.Fatalf("line %d: no method %s", ex.line, method)
	}
	in, out := dynamicpb.NewMessage(md.Input()), dynamicpb.NewMessage(md.Output())
	if data != "" {
		if err := protojson.Unmarshal([]byte(data), in); err != nil {
			t.Fatalf("line %d: -d: %v", ex.line, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got string
	if err := cc.Invoke(ctx, "/"+method, in, out); err != nil {
		st := grpcstatus.Convert(err)
		got = fmt.Sprintf("ERROR:\n  Code: %s\n  Message: %s", st.Code(), st.Message())
		if got != ex.out {
			t.Errorf("line %d: answered\n%s\nthe doc says\n%s", ex.line, got, ex.out)
		}
		return
	}
	if err := protojson.Unmarshal([]byte(ex.out), dynamicpb.NewMessage(md.Output())); err != nil {
		t.Errorf("line %d: the doc's answer is not a %s: %v", ex.line, md.Output().FullName(), err)
	}
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := sameJSON(ex.out, string(b)); err != nil || !ok {
		t.Errorf("line %d: answered\n%s\nthe doc says\n%s\n%v", ex.line, b, ex.out, err)
	}
}

// TestAPIDocExamples runs every curl and grpcurl example of docs/api.md, in
// order, against one node started with the rules above, and checks each
// answer is the one the doc shows.
func TestAPIDocExamples(t *testing.T) {
	t.Parallel()
	exs := consoleExamples(t, filepath.Join("..", "..", "docs", "api.md"))
	if len(exs) < 10 {
		t.Fatalf("docs/api.md has %d console examples", len(exs))
	}
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte(apiDocsRules), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startServe(t, "--node-name", "node-1", "--rules", rules)
	cc, err := grpc.NewClient(n.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	seen := map[string]int{}
	for _, ex := range exs {
		seen[ex.args[0]]++
		switch ex.args[0] {
		case "curl":
			runCurl(t, ex, n.http)
		case "grpcurl":
			runGRPCurl(t, ex, cc)
		default:
			t.Errorf("line %d: %s is not a command the test runs", ex.line, ex.args[0])
		}
	}
	t.Logf("ran %v", seen)
}
