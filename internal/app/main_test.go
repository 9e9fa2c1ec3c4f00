package app

import (
	"os"
	"testing"
)

// TestMain removes what the package's tests built once for all of them
// (chaosBinaries: ~100 MB of binaries in a temporary directory), which no
// single test's Cleanup can.
func TestMain(m *testing.M) {
	code := m.Run()
	if chaosBinDir != "" {
		_ = os.RemoveAll(chaosBinDir)
	}
	os.Exit(code)
}
