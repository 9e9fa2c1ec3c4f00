// Command rolesdoc rewrites the generated permission sections of the docs
// (roles.Regions) from transport/roles. Run from the repository root's
// transport/roles by go generate; its argument is the repository root.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/tapflow/tapflow/transport/roles"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: rolesdoc <repository root>")
		os.Exit(2)
	}
	done := map[string]bool{}
	for _, r := range roles.Regions {
		if done[r.File] {
			continue
		}
		done[r.File] = true
		path := filepath.Join(os.Args[1], r.File)
		b, err := os.ReadFile(path)
		if err == nil {
			var out string
			if out, err = roles.Update(r.File, string(b)); err == nil && out != string(b) {
				err = os.WriteFile(path, []byte(out), 0o644)
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "rolesdoc:", err)
			os.Exit(1)
		}
	}
}
