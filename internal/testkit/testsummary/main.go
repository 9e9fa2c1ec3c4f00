// Command testsummary reads `go test -json` on stdin and prints what a
// plain `go test` prints — package results, and the whole output of every
// failing test, of every test still running when its package failed (a
// timeout, a panic) and of every failing package — then every skipped
// test with its reason and every failed test. It exits 1 when a test, a
// package or a build failed, so `set -o pipefail; go test -json ... |
// go run ./internal/testkit/testsummary` fails as go test does.
//
// Skips are counted by kind: a missing prerequisite (the message of
// internal/testkit/prereq, which fails instead of skipping as root or with
// CI set), -short, and other (deliberate: an opt-in suite). With -v every
// line is printed as it comes, as go test -v does.
//
//	go test -json -race ./... | go run ./internal/testkit/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/tapflow/tapflow/internal/testkit/prereq"
)

func main() {
	verbose := flag.Bool("v", false, "print every output line as it comes (go test -v)")
	flag.Parse()
	os.Exit(run(os.Stdin, os.Stdout, *verbose))
}

// event is one line of test2json (go doc test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
	Elapsed    float64 // seconds, on a test's or package's pass/fail
}

// line is one output line of a package, tagged with its test ("" for the
// package itself).
type line struct{ test, text string }

// pkgState holds a running package's output until it is known whether it
// is printed.
type pkgState struct {
	name  string
	own   []string          // package-level lines
	tests map[string][]line // top-level test → its lines and its subtests'
	order []string          // top-level tests in the order they started
	kept  map[string]bool   // top-level tests still running
}

type skip struct{ name, reason string }

// timed is a top-level test's wall time, for the slowest list.
type timed struct {
	name    string
	seconds float64
}

// slowestShown is how many of the slowest top-level tests the summary
// lists: the CI budget is spent there.
const slowestShown = 10

type summary struct {
	out     *bufio.Writer
	verbose bool
	pkgs    map[string]*pkgState
	skipped []skip
	slowest []timed
	failed  []string
	bad     bool // a test, package or build failed
}

func run(in io.Reader, w io.Writer, verbose bool) int {
	s := &summary{out: bufio.NewWriter(w), verbose: verbose, pkgs: map[string]*pkgState{}}
	defer s.out.Flush()
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if b := sc.Bytes(); len(b) == 0 || b[0] != '{' || json.Unmarshal(b, &e) != nil {
			fmt.Fprintf(s.out, "%s\n", sc.Bytes()) // not test2json: the go command's own words
			s.out.Flush()
			continue
		}
		s.event(e)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(s.out, "testsummary: reading go test -json: %v\n", err)
		s.bad = true
	}
	// Packages that never ended (go test killed): print what they said.
	for name, p := range s.pkgs {
		fmt.Fprintf(s.out, "testsummary: %s did not finish; its output:\n", name)
		s.dump(p)
		s.bad = true
	}
	s.report()
	if s.bad {
		return 1
	}
	return 0
}

func (s *summary) pkg(name string) *pkgState {
	p := s.pkgs[name]
	if p == nil {
		p = &pkgState{name: name, tests: map[string][]line{}, kept: map[string]bool{}}
		s.pkgs[name] = p
	}
	return p
}

func root(test string) string {
	r, _, _ := strings.Cut(test, "/")
	return r
}

func (s *summary) event(e event) {
	switch e.Action {
	case "build-output":
		s.print(e.Output)
		return
	case "build-fail":
		s.bad = true
		return
	}
	if e.Package == "" {
		return
	}
	p := s.pkg(e.Package)
	if s.verbose && e.Action == "output" {
		s.print(e.Output)
	}
	switch {
	case e.Action == "run" && e.Test != "":
		if r := root(e.Test); !p.kept[r] && e.Test == r {
			p.kept[r] = true
			p.order = append(p.order, r)
		}
	case e.Action == "output" && e.Test != "" && p.kept[root(e.Test)]:
		r := root(e.Test)
		p.tests[r] = append(p.tests[r], line{e.Test, e.Output})
	case e.Action == "output":
		p.own = append(p.own, e.Output)
	case (e.Action == "pass" || e.Action == "skip" || e.Action == "fail") && e.Test != "":
		s.testEnd(e, p)
	case e.Action == "pass" || e.Action == "skip" || e.Action == "fail":
		s.pkgEnd(e, p)
	}
}

// testEnd: a failing top-level test's lines (its subtests' included) are
// printed now; a passing or skipped one's are dropped; a skip's reason is
// kept for the summary.
func (s *summary) testEnd(e event, p *pkgState) {
	r := root(e.Test)
	switch e.Action {
	case "skip":
		s.skipped = append(s.skipped, skip{e.Package + " " + e.Test, reason(p.tests[r], e.Test)})
	case "fail":
		s.bad = true
		s.failed = append(s.failed, e.Package+" "+e.Test)
	}
	if e.Test == r && e.Action != "skip" {
		s.slowest = append(s.slowest, timed{e.Package + " " + e.Test, e.Elapsed})
	}
	if e.Test != r || !p.kept[r] {
		return
	}
	if e.Action == "fail" && !s.verbose {
		for _, l := range p.tests[r] {
			s.print(l.text)
		}
	}
	delete(p.kept, r)
	delete(p.tests, r)
}

// pkgEnd: a failing package prints the tests still running (a timeout or
// a panic stops them) and its own lines (the panic, FAIL, -test.shuffle);
// a passing one prints its result line, as go test does.
func (s *summary) pkgEnd(e event, p *pkgState) {
	delete(s.pkgs, e.Package)
	if e.Action == "fail" {
		s.bad = true
		s.failed = append(s.failed, e.Package)
		if !s.verbose {
			s.dump(p)
		}
		return
	}
	if s.verbose {
		return
	}
	for _, l := range p.own {
		if strings.HasPrefix(l, "ok ") || strings.HasPrefix(l, "?  ") {
			s.print(l)
		}
	}
}

func (s *summary) dump(p *pkgState) {
	for _, r := range p.order {
		if p.kept[r] {
			for _, l := range p.tests[r] {
				s.print(l.text)
			}
			s.failed = append(s.failed, p.name+" "+r+" (still running)")
		}
	}
	for _, l := range p.own {
		s.print(l)
	}
}

func (s *summary) print(text string) {
	s.out.WriteString(text)
	if !strings.HasSuffix(text, "\n") {
		s.out.WriteByte('\n')
	}
	s.out.Flush() // CI shows progress as it comes
}

// logLine starts a t.Log line: "    file_test.go:12: ".
var logLine = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// reason is the skip message of test: its last log line (t.Skip logs,
// then stops) and the continuation lines after it.
func reason(lines []line, test string) string {
	var own []string
	for _, l := range lines {
		if l.test == test && !strings.HasPrefix(l.text, "=== ") && !strings.HasPrefix(strings.TrimSpace(l.text), "--- ") {
			own = append(own, strings.TrimRight(l.text, "\n"))
		}
	}
	for i := len(own) - 1; i >= 0; i-- {
		if logLine.MatchString(own[i]) {
			parts := []string{strings.TrimSpace(own[i])}
			for _, c := range own[i+1:] {
				parts = append(parts, strings.TrimSpace(c))
			}
			return strings.Join(parts, " ")
		}
	}
	return "(no reason given)"
}

// kind sorts a skip: a missing prerequisite, -short, or deliberate.
func kind(reason string) string {
	switch {
	case strings.Contains(reason, prereq.SkipPrefix):
		return "missing prerequisite"
	case strings.Contains(reason, "-short") || strings.Contains(reason, "not in -short"):
		return "-short"
	}
	return "deliberate"
}

func (s *summary) report() {
	if len(s.slowest) > 0 {
		sort.SliceStable(s.slowest, func(i, j int) bool { return s.slowest[i].seconds > s.slowest[j].seconds })
		n := min(len(s.slowest), slowestShown)
		fmt.Fprintf(s.out, "\n%d slowest tests (wall time; packages run in parallel):\n", n)
		for _, t := range s.slowest[:n] {
			fmt.Fprintf(s.out, "  %7.1fs %s\n", t.seconds, t.name)
		}
	}
	if len(s.skipped) > 0 {
		counts := map[string]int{}
		for _, k := range s.skipped {
			counts[kind(k.reason)]++
		}
		fmt.Fprintf(s.out, "\n%d skipped (%d missing prerequisite, %d -short, %d deliberate):\n", len(s.skipped),
			counts["missing prerequisite"], counts["-short"], counts["deliberate"])
		for _, k := range s.skipped {
			fmt.Fprintf(s.out, "  %s [%s]: %s\n", k.name, kind(k.reason), k.reason)
		}
	}
	if len(s.failed) > 0 {
		fmt.Fprintf(s.out, "\n%d failed:\n", len(s.failed))
		for _, f := range s.failed {
			fmt.Fprintf(s.out, "  %s\n", f)
		}
	}
}
