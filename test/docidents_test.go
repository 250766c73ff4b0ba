package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codeSpan finds Markdown inline code: `text`.
var codeSpan = regexp.MustCompile("`([^`\n]+)`")

// qualified is a Go identifier with a prefix: pkg.Name, Type.Member,
// pkg.Type.Member, optionally called: ownership.Step, Cache.Fence().
var qualified = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?(?:\(\))?$`)

// testName is a test, benchmark or fuzz target, with an optional subtest.
var testName = regexp.MustCompile(`^((?:Test|Benchmark|Fuzz)[A-Z0-9_][A-Za-z0-9_]*)(?:/\S*)?$`)

// fileLike is a span that names a file, not an identifier: ring.go.
var fileLike = regexp.MustCompile(`\.(go|md|yaml|yml|sh|json|proto|txt|sum|mod|py|toml|conf|service|html|sock|pem|crt|key)$`)

// goSymbols is what the repository's Go code declares: per package name
// its top-level identifiers, per type name its methods and fields (over
// every package that declares a type of that name), and every test,
// benchmark and fuzz function.
type goSymbols struct {
	pkgs  map[string]map[string]bool
	types map[string]map[string]bool
	tests map[string]bool
}

func loadGoSymbols(t *testing.T, root string) goSymbols {
	t.Helper()
	s := goSymbols{pkgs: map[string]map[string]bool{}, types: map[string]map[string]bool{}, tests: map[string]bool{}}
	add := func(m map[string]map[string]bool, k, v string) {
		if m[k] == nil {
			m[k] = map[string]bool{}
		}
		m[k][v] = true
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(s.pkgs, pkg, d.Name.Name)
					if strings.HasSuffix(path, "_test.go") && testName.MatchString(d.Name.Name) {
						s.tests[d.Name.Name] = true
					}
					continue
				}
				if len(d.Recv.List) == 1 {
					if rt := recvType(d.Recv.List[0].Type); rt != "" {
						add(s.types, rt, d.Name.Name)
					}
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch sp := spec.(type) {
					case *ast.TypeSpec:
						add(s.pkgs, pkg, sp.Name.Name)
						if s.types[sp.Name.Name] == nil {
							s.types[sp.Name.Name] = map[string]bool{}
						}
						switch ty := sp.Type.(type) {
						case *ast.StructType:
							for _, fl := range ty.Fields.List {
								for _, n := range fl.Names {
									add(s.types, sp.Name.Name, n.Name)
								}
								if len(fl.Names) == 0 { // embedded: its name is the field's
									if n := recvType(fl.Type); n != "" {
										add(s.types, sp.Name.Name, n)
									}
								}
							}
						case *ast.InterfaceType:
							for _, m := range ty.Methods.List {
								for _, n := range m.Names {
									add(s.types, sp.Name.Name, n.Name)
								}
							}
						}
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							add(s.pkgs, pkg, n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recvType returns the type name of a receiver or embedded field: T, *T,
// T[K], pkg.T.
func recvType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		return recvType(x.X)
	case *ast.IndexExpr:
		return recvType(x.X)
	case *ast.IndexListExpr:
		return recvType(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	}
	return ""
}

// TestDocIdentifiersExist: every Go identifier that README.md and docs/
// quote in backticks with a package or type prefix (`ownership.Step`,
// `Cache.Fence`, `writeback.Cache.Install`), and every test, benchmark
// and fuzz target they name, is declared in the repository's code. A
// renamed or removed function breaks this test, not the reader's search.
func TestDocIdentifiersExist(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	syms := loadGoSymbols(t, root)
	if len(syms.pkgs["ownership"]) == 0 || len(syms.tests) < 100 {
		t.Fatalf("parsed too little: %d identifiers of package ownership, %d tests", len(syms.pkgs["ownership"]), len(syms.tests))
	}
	files := []string{filepath.Join(root, "README.md")}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, docs...)
	checked := 0
	eachLine(t, root, files, stripFences, func(_, at, line string) {
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			span := strings.TrimSpace(m[1])
			if msg := syms.check(span); msg != "" {
				t.Errorf("%s: `%s`: %s", at, span, msg)
			}
			if syms.checks(span) {
				checked++
			}
		}
	})
	t.Logf("%d identifiers checked in %d files", checked, len(files))
	if checked < 100 {
		t.Fatalf("only %d identifiers checked: the patterns no longer match the docs", checked)
	}
}

// checks reports whether check looks at span at all.
func (s goSymbols) checks(span string) bool {
	if testName.MatchString(span) {
		return true
	}
	m := qualified.FindStringSubmatch(span)
	if m == nil || fileLike.MatchString(span) {
		return false
	}
	_, isPkg := s.pkgs[m[1]]
	_, isType := s.types[m[1]]
	return isPkg || isType
}

// check returns what is wrong with the identifier span names, or "" when
// it exists or span is not one this test reads (a file name, a metric, a
// flag, a type of no package here).
func (s goSymbols) check(span string) string {
	if m := testName.FindStringSubmatch(span); m != nil {
		if !s.tests[m[1]] {
			return "no test, benchmark or fuzz function of that name in any _test.go file"
		}
		return ""
	}
	m := qualified.FindStringSubmatch(span)
	if m == nil || fileLike.MatchString(span) {
		return ""
	}
	first, second, third := m[1], m[2], m[3]
	if idents, ok := s.pkgs[first]; ok && first != strings.ToUpper(first[:1])+first[1:] {
		// pkg.Name or pkg.Type.Member.
		if !idents[second] {
			return "package " + first + " declares no " + second
		}
		if third != "" && !s.types[second][third] {
			return second + " has no method or field " + third
		}
		return ""
	}
	if members, ok := s.types[first]; ok {
		// Type.Member (Type.Member.Sub is a field's field: not read); a
		// protobuf message's field may be quoted as the .proto names it
		// (ForwardRequest.takes_leases: TakesLeases in Go).
		if !members[second] && !members[goName(second)] {
			return "type " + first + " has no method or field " + second
		}
	}
	return ""
}

// goName returns the Go name protoc-gen-go gives a .proto field name:
// takes_leases → TakesLeases.
func goName(field string) string {
	var b strings.Builder
	for _, part := range strings.Split(field, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}
