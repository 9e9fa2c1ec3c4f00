// Package version holds the build version, set by the Makefile with -ldflags.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is the tapflow version ("dev" for go run / go test builds).
var Version = "dev"

// Revision is the VCS commit the binary was built from; the Makefile sets
// it, else it is read from the build info Go embeds ("unknown" without).
var Revision = ""

// GoVersion is the Go toolchain that built the binary.
func GoVersion() string { return runtime.Version() }

// Commit returns Revision, or the vcs.revision of the embedded build info
// (go build in a git checkout), or "unknown".
func Commit() string {
	if Revision != "" {
		return Revision
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && s.Value != "" {
				return s.Value
			}
		}
	}
	return "unknown"
}
