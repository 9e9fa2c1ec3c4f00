// Command schemagen writes schemas/flow_gen.go from the column table.
// Run through `go generate ./schemas` (make generate).
package main

import (
	"fmt"
	"os"

	"github.com/tapflow/tapflow/schemas/columns"
	"github.com/tapflow/tapflow/schemas/internal/gen"
)

func main() {
	out := "flow_gen.go"
	if len(os.Args) > 1 {
		out = os.Args[1]
	}
	src, err := gen.Render("Flow", columns.FlowV1)
	if err == nil {
		err = os.WriteFile(out, src, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "schemagen:", err)
		os.Exit(1)
	}
}
