// Command schemagen writes the generated file of every record table
// (columns.Tables: flow_gen.go, meter_gen.go) into a directory (default:
// the current one). Run through `go generate ./schemas` (make generate).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tapflow/tapflow/schemas/columns"
	"github.com/tapflow/tapflow/schemas/internal/gen"
)

func main() {
	dir := "."
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	for _, t := range columns.Tables {
		src, err := gen.Render(t)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, t.File), src, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "schemagen:", err)
			os.Exit(1)
		}
	}
}
