package cluster

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// recordWrites are the calls that change what decides a key on this node:
// the cache's fences and installs of other nodes' copies, and the book's
// record of them. Only the executor (carry.go) makes them.
var recordWrites = map[string]string{
	"Fence": "cache", "FenceIfDeciding": "cache", "Unfence": "cache", "UnfenceUnlessFencedAfter": "cache",
	"Install": "cache", "InstallHanded": "cache", "InstallUnlessFencedSince": "cache", "InstallUnlessFencedAfter": "cache", "Merge": "cache",
	"Carried": "book",
}

// TestOnlyTheExecutorWritesRecords reads the package's source: every call
// that changes a key's records (recordWrites) on the node's cache or book
// is in carry.go, where ownership's effects are carried out. A new call
// elsewhere would be a decision the component did not make.
func TestOnlyTheExecutorWritesRecords(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	found := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			field, ok := sel.X.(*ast.SelectorExpr) // n.cache.X(...), n.book.X(...)
			if !ok || recordWrites[sel.Sel.Name] != field.Sel.Name {
				return true
			}
			found++
			if name != "carry.go" {
				t.Errorf("%s: %s.%s outside the executor (carry.go)", fset.Position(call.Pos()), field.Sel.Name, sel.Sel.Name)
			}
			return true
		})
	}
	if found == 0 {
		t.Fatal("no record write found at all: the check reads nothing")
	}
	t.Logf("%d record writes, all in carry.go", found)
}

// effectGuards are the node's acts that only Step decides (ownership.
// Effects): each call must sit under an if that reads its effect.
var effectGuards = map[string]string{"noteGivenUp": "NoteGivenUp", "pullStandIn": "PullStandIn"}

// The node gives up a check, notes it, and takes in a stand-in's decision
// only where Step said so: every call of those acts in package cluster
// sits in an if whose condition reads the effect.
func TestOnlyStepGivesChecksUp(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	calls, guarded := 0, map[token.Pos]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var all []*ast.CallExpr
		ast.Inspect(f, func(node ast.Node) bool {
			switch x := node.(type) {
			case *ast.CallExpr:
				if sel, ok := x.Fun.(*ast.SelectorExpr); ok && effectGuards[sel.Sel.Name] != "" {
					all = append(all, x)
				}
			case *ast.IfStmt:
				reads := map[string]bool{}
				ast.Inspect(x.Cond, func(c ast.Node) bool {
					if sel, ok := c.(*ast.SelectorExpr); ok {
						reads[sel.Sel.Name] = true
					}
					return true
				})
				ast.Inspect(x.Body, func(c ast.Node) bool {
					if call, ok := c.(*ast.CallExpr); ok {
						if sel, ok := call.Fun.(*ast.SelectorExpr); ok && reads[effectGuards[sel.Sel.Name]] {
							guarded[call.Pos()] = true
						}
					}
					return true
				})
			}
			return true
		})
		for _, call := range all {
			calls++
			if !guarded[call.Pos()] {
				t.Errorf("%s: %s outside an if that reads its effect", fset.Position(call.Pos()), call.Fun.(*ast.SelectorExpr).Sel.Name)
			}
		}
	}
	if calls < len(effectGuards) {
		t.Fatalf("%d calls found: the check reads nothing", calls)
	}
	t.Logf("%d calls, each under its effect", calls)
}
