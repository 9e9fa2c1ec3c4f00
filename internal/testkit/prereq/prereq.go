// Package prereq is the one place a test decides what to do when the
// machine lacks something it needs: root, a command, a kernel feature, a
// tmpfs, a Debian package.
//
// Where every test is meant to run — as root, or with the CI environment
// variable set — a missing prerequisite fails the test, naming it and the
// fix (usually `make deps` as root). Elsewhere (a developer's non-root
// shell) the test skips with the same message. So a skip can never hide a
// missing prerequisite in CI: on a CI machine without clang, the eBPF
// tests fail instead of passing as skipped.
//
// Skips that are not about the machine stay plain t.Skip: `-short`
// (inside `if testing.Short()`), and opt-in suites run by another make
// target, marked with a "deliberate skip:" comment. TestEverySkipIsAccounted
// checks that every skip in the repository is one of these.
package prereq

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// SkipPrefix starts every skip message of this package, so a skip summary
// (internal/testkit/testsummary) can tell missing prerequisites from
// deliberate skips.
const SkipPrefix = "missing prerequisite: "

// geteuid is os.Geteuid; the package's tests replace it.
var geteuid = os.Geteuid

// Strict reports whether a missing prerequisite fails rather than skips,
// and why: running as root (which can install or mount anything a test
// needs) or with CI set to anything but "", "0" or "false".
func Strict() (bool, string) {
	if geteuid() == 0 {
		return true, "running as root"
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "0" && !strings.EqualFold(ci, "false") {
		return true, "CI=" + ci + " is set"
	}
	return false, ""
}

// Missing stops tb: it fails when Strict, skips otherwise. what names the
// prerequisite (with the error that showed it missing); fix says how to
// get it.
func Missing(tb testing.TB, what, fix string) {
	tb.Helper()
	msg := SkipPrefix + what
	if fix != "" {
		msg += " (fix: " + fix + ")"
	}
	if strict, why := Strict(); strict {
		tb.Fatalf("%s; a failure, not a skip, because %s", msg, why)
		return
	}
	tb.Skipf("%s; skipped as neither root nor CI (as root or with CI set this fails)", msg)
}

// Require stops tb with Missing when err is not nil.
func Require(tb testing.TB, what string, err error, fix string) {
	tb.Helper()
	if err != nil {
		Missing(tb, fmt.Sprintf("%s: %v", what, err), fix)
	}
}

// Root stops tb unless the test runs as root; why says what root is for.
// As a non-root user with CI set it fails: CI runs make test as root.
func Root(tb testing.TB, why string) {
	tb.Helper()
	if uid := geteuid(); uid != 0 {
		Missing(tb, fmt.Sprintf("root (running as uid %d): %s", uid, why), "run the tests as root, as CI does")
	}
}

// Command returns the path of the named program, or stops tb with
// Missing; fix says how to install it (e.g. "make deps installs Debian's
// iproute2").
func Command(tb testing.TB, name, fix string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(tb, "command "+name+": "+err.Error(), fix)
	}
	return p
}
