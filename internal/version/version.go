// Package version holds the build version, set by the Makefile with -ldflags.
package version

// Version is the tapflow version ("dev" for go run / go test builds).
var Version = "dev"
