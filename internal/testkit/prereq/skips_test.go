package prereq

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// DeliberateMark marks a skip that is not about the machine (an opt-in
// suite another make target runs): on the skip's line or the line above.
const deliberateMark = "deliberate skip:"

// unaccountedSkips returns "file:line" of every t.Skip, t.Skipf or
// t.SkipNow in src that is neither inside `if testing.Short()` nor marked
// with a "deliberate skip:" comment on its line or the line above.
func unaccountedSkips(fset *token.FileSet, f *ast.File) []string {
	marked := map[int]bool{}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			if strings.Contains(c.Text, deliberateMark) {
				l := fset.Position(c.Pos()).Line
				marked[l], marked[l+1] = true, true
			}
		}
	}
	var out []string
	var stack []ast.Node
	ast.Inspect(f, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return false
		}
		stack = append(stack, n)
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Skip" && sel.Sel.Name != "Skipf" && sel.Sel.Name != "SkipNow") {
			return true
		}
		if _, ok := sel.X.(*ast.Ident); !ok { // t.Skip, b.Skip, tb.Skip; not p.seq.Skip()
			return true
		}
		pos := fset.Position(call.Pos())
		if marked[pos.Line] || underShort(stack) {
			return true
		}
		out = append(out, pos.String())
		return true
	})
	return out
}

// underShort: an enclosing if statement's condition is testing.Short()
// alone (`testing.Short() || notRoot` would hide a prerequisite).
func underShort(stack []ast.Node) bool {
	for _, n := range stack {
		ifs, ok := n.(*ast.IfStmt)
		if !ok {
			continue
		}
		call, ok := ifs.Cond.(*ast.CallExpr)
		if !ok || len(call.Args) != 0 {
			continue
		}
		if s, ok := call.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "Short" {
			if x, ok := s.X.(*ast.Ident); ok && x.Name == "testing" {
				return true
			}
		}
	}
	return false
}

func TestUnaccountedSkips(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int
	}{
		{"plain skip", `if os.Geteuid() != 0 { t.Skip("needs root") }`, 1},
		{"skipf and skipnow", `t.Skipf("x %d", 1); t.SkipNow()`, 2},
		{"benchmark skip", `b.Skip("needs root")`, 1},
		{"short", `if testing.Short() { t.Skip("-short") }`, 0},
		{"short or a prerequisite", `if testing.Short() || os.Geteuid() != 0 { t.Skip("-short or not root") }`, 1},
		{"short, nested", `if testing.Short() { if x { t.Skip("-short: x") } }`, 0},
		{"marked above", "// deliberate skip: run by make test-openstack\nt.Skip(reason)", 0},
		{"marked on the line", `t.Skip(reason) // deliberate skip: opt-in`, 0},
		{"marked two lines above", "// deliberate skip: too far\n\nt.Skip(reason)", 1},
		{"prereq", `prereq.Root(t, "mount a tmpfs")`, 0},
		{"not a testing skip", `p.seq.Skip()`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "package p\nfunc f() {\n" + tc.body + "\n}\n"
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "x_test.go", src, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if got := unaccountedSkips(fset, f); len(got) != tc.want {
				t.Errorf("unaccountedSkips = %q, want %d", got, tc.want)
			}
		})
	}
}

// TestEverySkipIsAccounted: every skip in the repository (both Go
// modules) goes through this package, sits under `if testing.Short()`, or
// is marked "deliberate skip:" with its reason.
func TestEverySkipIsAccounted(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root: %v", err)
	}
	self, _ := os.Getwd()
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch n := d.Name(); {
			case p == self, n == "testdata", n == "node_modules", n == "vendor", p != root && strings.HasPrefix(n, "."):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, at := range unaccountedSkips(fset, f) {
			rel, _ := filepath.Rel(root, at)
			t.Errorf("%s: a skip that may hide a missing prerequisite: use prereq.Root, prereq.Command or prereq.Require (internal/testkit/prereq), put it under `if testing.Short()`, or mark it with a %q comment saying why", rel, "// "+deliberateMark)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("parsed %d Go files under %s: not the repository", files, root)
	}
}
