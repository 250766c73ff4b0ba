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
	"Install": "cache", "InstallUnlessFencedSince": "cache", "InstallUnlessFencedAfter": "cache", "Merge": "cache",
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
