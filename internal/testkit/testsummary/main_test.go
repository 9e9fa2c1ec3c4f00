package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// goTestJSON runs go test -json on the packages of testdata/fake (a
// module of its own: ./... of the repository never runs it) and returns
// its output and whether go test failed.
func goTestJSON(t *testing.T, env []string, args ...string) ([]byte, bool) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"test", "-json", "-count=1"}, args...)...)
	cmd.Dir = "testdata/fake"
	cmd.Env = append(os.Environ(), append([]string{"GOWORK=off", "GOFLAGS="}, env...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("go test: %v %s", err, stderr.Bytes())
	}
	return out, err != nil
}

// TestSummary feeds real go test -json output through run: a failing
// test's whole output (its subtests' included) is printed, a passing
// test's is not; a build failure and a timeout show everything needed to
// debug them; skips are listed with their reason and kind; the exit code
// follows go test's.
func TestSummary(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds and runs the fake module's tests (a timeout run of 3 s)")
	}
	failing, failed := goTestJSON(t, []string{"FAKE_HANG=1"}, "-timeout", "3s", "./...")
	if !failed {
		t.Fatal("go test of testdata/fake passed; the fixture must fail")
	}
	short, failed := goTestJSON(t, nil, "-short", "./ok")
	if failed {
		t.Fatalf("go test -short ./ok failed:\n%s", short)
	}
	for _, tc := range []struct {
		name    string
		in      []byte
		verbose bool
		code    int
		want    []string
		wantNot []string
	}{
		{"failures", failing, false, 1, []string{
			"undefined: nope", "FAIL\texample.com/fake/broken [build failed]", // the compiler's words
			"fail-log-before", "inner-boom", "fine-line", "--- FAIL: TestFail (", // every line of the failing test
			"hang-log-before", "panic: test timed out after 3s", "FAIL\texample.com/fake/bad", // the timed-out test and the panic
			"ok  \texample.com/fake/ok",
			"2 skipped (1 missing prerequisite, 0 -short, 1 deliberate):",
			"example.com/fake/ok TestSkip [missing prerequisite]: ok_test.go:7: missing prerequisite: command nope (fix: make deps)",
			"example.com/fake/ok TestSubs/b [deliberate]: ok_test.go:17: opt-in: set FAKE=1",
			"failed:\n", "example.com/fake/bad TestFail/inner\n", "example.com/fake/bad TestHang (still running)\n", "example.com/fake/broken\n",
		}, []string{"pass-log-line", "sub-pass-line", "=== RUN   TestPass"}},
		{"short run passes", short, false, 0, []string{
			"ok  \texample.com/fake/ok",
			"slowest tests (wall time; packages run in parallel):", "s example.com/fake/ok TestPass\n",
			"3 skipped (1 missing prerequisite, 1 -short, 1 deliberate):", "TestShort [-short]: ok_test.go:11: -short: takes long",
		}, []string{"pass-log-line", "failed:"}},
		{"verbose", short, true, 0, []string{"pass-log-line", "sub-pass-line", "--- PASS: TestPass", "3 skipped"}, nil},
		{"not test2json", []byte("go: cannot find main module\n"), false, 0, []string{"go: cannot find main module\n"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if code := run(bytes.NewReader(tc.in), &out, tc.verbose); code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q", w)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(out.String(), w) {
					t.Errorf("output has %q", w)
				}
			}
			if t.Failed() {
				t.Logf("output:\n%s", out.String())
			}
		})
	}
}

// TestTruncated: go test killed before its packages end still shows what
// they said, and fails.
func TestTruncated(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"    a_test.go:3: last words\n"}
`
	var out bytes.Buffer
	if code := run(strings.NewReader(in), &out, false); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	for _, w := range []string{"p did not finish", "last words", "p TestA (still running)"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
}
