package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// openAPI is docs/openapi.yaml as plain values.
type openAPI map[string]any

func loadOpenAPI(t *testing.T) openAPI {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("docs/openapi.yaml: %v", err)
	}
	spec := openAPI(m)
	if v, _ := spec["openapi"].(string); !strings.HasPrefix(v, "3.") {
		t.Fatalf("docs/openapi.yaml: openapi %q, want 3.x", v)
	}
	return spec
}

func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }

// resolve follows a local $ref ("#/components/...").
func (s openAPI) resolve(t *testing.T, v map[string]any) map[string]any {
	t.Helper()
	for v != nil {
		ref, ok := v["$ref"].(string)
		if !ok {
			return v
		}
		var cur any = map[string]any(s)
		for _, p := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = obj(cur)[p]
		}
		if obj(cur) == nil {
			t.Fatalf("docs/openapi.yaml: $ref %s resolves to nothing", ref)
		}
		v = obj(cur)
	}
	return v
}

// conforms reports where the JSON value v breaks schema sch: a field the
// schema does not list, a required one missing, a wrong type.
func (s openAPI) conforms(t *testing.T, sch map[string]any, v any, at string) error {
	t.Helper()
	sch = s.resolve(t, sch)
	if alts, ok := sch["oneOf"].([]any); ok {
		var errs []string
		for _, a := range alts {
			err := s.conforms(t, obj(a), v, at)
			if err == nil {
				return nil
			}
			errs = append(errs, err.Error())
		}
		return fmt.Errorf("%s matches none of oneOf: %s", at, strings.Join(errs, "; "))
	}
	switch typ, _ := sch["type"].(string); typ {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %T", at, v)
		}
		props := obj(sch["properties"])
		for k, e := range m {
			p, ok := props[k]
			if !ok {
				return fmt.Errorf("%s: field %q is not in the schema", at, k)
			}
			if err := s.conforms(t, obj(p), e, at+"."+k); err != nil {
				return err
			}
		}
		required, _ := sch["required"].([]any)
		for _, r := range required {
			if _, ok := m[r.(string)]; !ok {
				return fmt.Errorf("%s: required field %q missing", at, r)
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, got %T", at, v)
		}
		for i, e := range a {
			if err := s.conforms(t, obj(sch["items"]), e, at+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: want a string, got %T", at, v)
		}
		if en, ok := sch["enum"].([]any); ok && !slices.Contains(en, any(str)) {
			return fmt.Errorf("%s: %q is not one of %v", at, str, en)
		}
		if p, ok := sch["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			return fmt.Errorf("%s: %q does not match %s", at, str, p)
		}
	case "integer":
		if _, ok := v.(json.Number); !ok {
			return fmt.Errorf("%s: want an integer, got %T", at, v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: want a boolean, got %T", at, v)
		}
	default:
		return fmt.Errorf("%s: the schema has no type the test knows (%q)", at, typ)
	}
	return nil
}

// docRequest is one request the test builds from an operation's examples.
type docRequest struct {
	name   string
	query  url.Values
	header http.Header
	body   []byte
}

// requestsOf builds an operation's requests: one per example of its JSON
// body (or one without a body), each with the examples of its query and
// header parameters.
func (s openAPI) requestsOf(t *testing.T, op map[string]any) []docRequest {
	t.Helper()
	base := docRequest{name: "parameters' examples", query: url.Values{}, header: http.Header{}}
	params, _ := op["parameters"].([]any)
	for _, p := range params {
		p := s.resolve(t, obj(p))
		ex, ok := p["example"]
		if !ok {
			t.Fatalf("parameter %v has no example", p["name"])
		}
		v := fmt.Sprint(ex)
		switch p["in"] {
		case "query":
			base.query.Set(p["name"].(string), v)
		case "header":
			base.header.Set(p["name"].(string), v)
		}
	}
	exs := obj(obj(obj(obj(op["requestBody"])["content"])["application/json"])["examples"])
	if len(exs) == 0 {
		return []docRequest{base}
	}
	names := make([]string, 0, len(exs))
	for n := range exs {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []docRequest
	for _, n := range names {
		b, err := json.Marshal(obj(exs[n])["value"])
		if err != nil {
			t.Fatalf("example %s: %v", n, err)
		}
		r := base
		r.name, r.body = n, b
		out = append(out, r)
	}
	return out
}

// responseFor returns the documented response of code: its own, or its
// range's ("4XX").
func responseFor(responses map[string]any, code int) (map[string]any, bool) {
	if r, ok := responses[strconv.Itoa(code)]; ok {
		return obj(r), true
	}
	r, ok := responses[strconv.Itoa(code/100)+"XX"]
	return obj(r), ok
}

var muxPattern = regexp.MustCompile(`mux\.Handle(?:Func)?\("([^"]+)"`)

// TestOpenAPI checks docs/openapi.yaml against a node: every route the
// HTTP server registers (transport/http.go, hold.go) is in the spec; every request
// built from the spec's examples, sent twice, answers a documented status
// with a documented content type, and a JSON answer has only the fields
// of its documented schema (and its required ones); a method the spec does
// not list for a path answers 405.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	spec := loadOpenAPI(t)
	paths := obj(spec["paths"])

	var src []byte
	for _, f := range []string{"http.go", "hold.go"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "transport", f))
		if err != nil {
			t.Fatal(err)
		}
		src = append(src, b...)
	}
	routes := muxPattern.FindAllStringSubmatch(string(src), -1)
	if len(routes) < 7 {
		t.Fatalf("found %d routes in transport/http.go", len(routes))
	}
	for _, m := range routes {
		method, path, ok := strings.Cut(m[1], " ")
		if !ok {
			method, path = "", m[1]
		}
		path = strings.TrimSuffix(path, "{$}")
		if strings.HasPrefix(path, "/debug/pprof/") {
			path = "/debug/pprof/" // its pages are described with the index
		}
		item := obj(paths[path])
		if item == nil {
			t.Errorf("route %q is not in docs/openapi.yaml", m[1])
			continue
		}
		if method != "" && item[strings.ToLower(method)] == nil {
			t.Errorf("route %q: the spec has no %s for %s", m[1], method, path)
		}
	}

	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte(apiDocsRules), 0o644); err != nil {
		t.Fatal(err)
	}
	n := startServe(t, "--node-name", "node-1", "--rules", rules, "--pprof")
	seen := map[string]map[int]bool{}
	for path, item := range paths {
		for _, method := range []string{"get", "post", "put", "delete", "patch"} {
			op := obj(obj(item)[method])
			if op == nil {
				if path == "/debug/pprof/" {
					continue // net/http/pprof serves any method
				}
				r := send(t, n.http, strings.ToUpper(method), path, docRequest{})
				if r.code != http.StatusMethodNotAllowed {
					t.Errorf("%s %s (not in the spec) answered %d, want 405", method, path, r.code)
				}
				continue
			}
			responses := obj(op["responses"])
			for _, req := range spec.requestsOf(t, op) {
				for range 2 {
					r := send(t, n.http, strings.ToUpper(method), path, req)
					what := fmt.Sprintf("%s %s (%s) answered %d", method, path, req.name, r.code)
					if seen[method+" "+path] == nil {
						seen[method+" "+path] = map[int]bool{}
					}
					seen[method+" "+path][r.code] = true
					resp, ok := responseFor(responses, r.code)
					if !ok {
						t.Errorf("%s, not a documented status: %.300s", what, r.body)
						continue
					}
					mt, _, err := mime.ParseMediaType(r.header.Get("Content-Type"))
					if err != nil {
						t.Errorf("%s with Content-Type %q: %v", what, r.header.Get("Content-Type"), err)
						continue
					}
					media := obj(obj(resp["content"])[mt])
					if media == nil {
						t.Errorf("%s with Content-Type %s, not documented for it", what, mt)
						continue
					}
					for h := range obj(resp["headers"]) {
						if h == "Retry-After" && r.header.Get(h) == "" {
							t.Errorf("%s without its documented %s header", what, h)
						}
					}
					if mt != "application/json" {
						continue
					}
					d := json.NewDecoder(bytes.NewReader(r.body))
					d.UseNumber()
					var v any
					if err := d.Decode(&v); err != nil {
						t.Errorf("%s with a body that is not JSON: %v", what, err)
						continue
					}
					if err := spec.conforms(t, obj(media["schema"]), v, "body"); err != nil {
						t.Errorf("%s: %v\n%s", what, err, r.body)
					}
				}
			}
		}
	}
	t.Logf("statuses seen: %v", seen)
	// The examples reach every status the check can answer on one
	// healthy node.
	for _, code := range []int{200, 400, 429} {
		if !seen["post /v1/check"][code] {
			t.Errorf("no example of POST /v1/check answered %d", code)
		}
	}
	if !seen["get /v1/forward-auth"][200] || !seen["get /v1/forward-auth"][429] {
		t.Errorf("the forward-auth examples answered %v, want 200 and 429", seen["get /v1/forward-auth"])
	}
}

func send(t *testing.T, addr, method, path string, req docRequest) httpResult {
	t.Helper()
	u := "http://" + addr + path
	if len(req.query) > 0 {
		u += "?" + req.query.Encode()
	}
	r, err := http.NewRequest(method, u, bytes.NewReader(req.body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range req.header {
		r.Header[k] = v
	}
	if req.body != nil {
		r.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return httpResult{resp.StatusCode, resp.Header, b}
}

// httpResult is one HTTP answer.
type httpResult struct {
	code   int
	header http.Header
	body   []byte
}
