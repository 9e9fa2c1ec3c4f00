// Command schemagen writes the generated file of every record table
// (columns.Tables: flow_gen.go, meter_gen.go) into a directory (default:
// the current one), and docs/schema.md to the path given second (default
// gen.DocFile, relative to package schemas). Run through
// `go generate ./schemas` (make generate).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tapflow/tapflow/schemas/columns"
	"github.com/tapflow/tapflow/schemas/internal/gen"
)

func main() {
	dir, doc := ".", gen.DocFile
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	if len(os.Args) > 2 {
		doc = os.Args[2]
	}
	for _, t := range columns.Tables {
		src, err := gen.Render(t)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, t.File), src, 0o644)
		}
		if err != nil {
			fail(err)
		}
	}
	md, err := gen.RenderDoc(columns.Tables)
	if err == nil {
		err = os.WriteFile(doc, md, 0o644)
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "schemagen:", err)
	os.Exit(1)
}
