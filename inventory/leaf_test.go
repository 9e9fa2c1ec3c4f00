package inventory_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLeaf: package inventory imports nothing from the module, and its
// subpackages nothing but it (test files aside), so the model stays a
// leaf every stage can import without importing the others.
func TestLeaf(t *testing.T) {
	const module = "github.com/tapflow/tapflow/"
	allowed := map[string]map[string]bool{
		".":     {},
		"synth": {module + "inventory": true},
	}
	dirs, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if d.IsDir() && d.Name() != "testdata" {
			if _, ok := allowed[d.Name()]; !ok {
				t.Errorf("subpackage inventory/%s: add it to TestLeaf with what it may import from the module", d.Name())
			}
		}
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, im := range af.Imports {
				p, _ := strconv.Unquote(im.Path.Value)
				if (strings.HasPrefix(p, module) || p == strings.TrimSuffix(module, "/")) && !ok[p] {
					t.Errorf("%s imports %s: package inventory is a leaf of the module (inventory/doc.go)", f, p)
				}
			}
		}
	}
}
